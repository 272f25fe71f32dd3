"""build_app: the FastAPI application around one engine (routes, auth, errors, metrics, lifecycle)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from paged_core.clients.factory import thread_client
from paged_core.errors import ConfigError
from paged_core.serve import anthropic, chat, completions, lora_routes, openapi
from paged_core.serve.async_engine import AsyncEngine
from paged_core.serve.auth import BearerAuth
from paged_core.serve.body import parse_body
from paged_core.serve.errors import APIError, CatchUnexpected, install_handlers
from paged_core.serve.health import HealthProbe, health_response
from paged_core.serve.metrics import ServerMetrics
from paged_core.serve.openapi import install_openapi
from paged_core.serve.protocol import DetokenizeRequest, TokenizeRequest
from paged_core.serve.settings import ServeConfig
from paged_core.serve.state import ServerState, get_state
from paged_core.serve.tokens import Tokens

log = logging.getLogger("paged.serve")


def build_app(engine: AsyncEngine | Any, config: ServeConfig | None = None) -> FastAPI:
    """An OpenAI-compatible app serving ``engine``; the core runs (and is stopped) with the app's lifespan.

    ``engine`` is an :class:`AsyncEngine` (over a core process or a core thread), or an in-process
    :class:`~paged_core.engine_core.core.EngineCore` (or anything with its interface), which gets a thread.
    """
    config = config or ServeConfig()
    aengine = engine if isinstance(engine, AsyncEngine) else AsyncEngine(thread_client(engine), engine.tokenizer)
    metrics = ServerMetrics(lambda: aengine.stats, read_cores=lambda: aengine.per_core)
    aengine.observer = metrics.observe
    facts = aengine.facts
    state = ServerState(
        config=config,
        engine=aengine,
        metrics=metrics,
        tokens=Tokens(
            aengine.input,
            allow_special_in_content=config.allow_special_tokens_in_content,
            chat_template=config.chat_template,
        ),
        model_name=config.served_model_name or facts.model_name,
        max_model_len=facts.max_model_len,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        aengine.start()
        try:
            await _load_modules(state)
            yield
        finally:
            aengine.stop()
            state.tokens.close()
            state.grammar.close()

    app = FastAPI(title="paged", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.paged = state
    install_handlers(app)
    install_openapi(app, api_key=bool(config.api_key))
    if config.api_key:
        app.add_middleware(BearerAuth, api_key=config.api_key)
    # Added last, so outermost: /health is answered before auth or routing, and errors of everything inside
    # (auth included) are caught before Starlette's last-resort handler.
    app.add_middleware(CatchUnexpected)
    app.add_middleware(HealthProbe, healthy=lambda: aengine.healthy, engines=aengine.core_health)
    app.add_middleware(QuietStartupFailure, state=state)
    app.include_router(completions.router)
    app.include_router(chat.router)
    app.include_router(anthropic.router)  # Anthropic's Messages API
    if config.enable_lora_runtime_updates:  # as vLLM: without it the routes do not exist (404)
        log.warning("runtime LoRA loading is on: any client can make the server read an adapter directory")
        app.include_router(lora_routes.router)
    _add_info_routes(app)
    return app


def _add_info_routes(app: FastAPI) -> None:
    @app.get("/health", openapi_extra=openapi.HEALTH)
    async def health(request: Request) -> Response:
        """200 ``{"status": "ok"}`` while the engine thread runs, 503 once it has died (see :class:`HealthProbe`)."""
        engine = get_state(request).engine
        return health_response(engine.healthy, engine.core_health())

    @app.get("/metrics", openapi_extra=openapi.METRICS)
    async def metrics(request: Request) -> Response:
        """Prometheus exposition text."""
        return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", openapi_extra=openapi.MODELS)
    async def models(request: Request) -> JSONResponse:
        """The base model, then each LoRA adapter (``parent``: the base model's served name, ``root``: its path)."""
        s = get_state(request)
        base = {
            "id": s.model_name,
            "object": "model",
            "created": s.created,
            "owned_by": "paged",
            "max_model_len": s.max_model_len,
            "root": s.engine.facts.model_path,
            "parent": None,
        }
        cards = [base]
        for lora in s.loras.adapters.values():
            card = {**base, "id": lora.name, "root": lora.path, "parent": s.model_name}
            cards.append(card)
        return JSONResponse({"object": "list", "data": cards})

    @app.post("/tokenize", openapi_extra=openapi.TOKENIZE)
    async def tokenize(request: Request) -> JSONResponse:
        """Token ids of ``prompt`` or of ``messages`` through the chat template."""
        s = get_state(request)
        req = await parse_body(request, TokenizeRequest, s.config.max_body_bytes)
        s.check_model(req.model, required=False)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of 'prompt' or 'messages'", param="prompt")
        # Text that cannot fit the context is refused by size, as the generation routes do: tokenizing a few MiB
        # costs seconds of a core, which a client could otherwise spend at will.
        if req.messages is not None:
            s.tokens.refuse_oversize(sum(len(m.text()) for m in req.messages), s.max_model_len, "messages")
            ids = await s.tokens.offload(s.tokens.render_chat, req.messages, req.add_generation_prompt)
        else:
            s.tokens.refuse_oversize(len(req.prompt or ""), s.max_model_len, "prompt")
            ids = await s.tokens.offload(s.tokens.encode, req.prompt or "", add_special_tokens=req.add_special_tokens)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": s.max_model_len})

    @app.post("/detokenize", openapi_extra=openapi.DETOKENIZE)
    async def detokenize(request: Request) -> JSONResponse:
        """Text of ``tokens``."""
        s = get_state(request)
        req = await parse_body(request, DetokenizeRequest, s.config.max_body_bytes)
        s.check_model(req.model, required=False)
        text = await s.tokens.offload(_detokenize, s.tokens, req.tokens)
        return JSONResponse({"prompt": text})


class QuietStartupFailure:
    """Pure ASGI middleware: a start-up that failed for a reason already logged in a line (``state.startup_error``,
    e.g. an adapter that did not load) reaches uvicorn without Starlette's traceback, which says nothing more."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def quiet(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and self.state.startup_error is not None:
                message = {**message, "message": ""}
            await send(message)

        await self.app(scope, receive, quiet)


async def _load_modules(state: ServerState) -> None:
    """Load ``--lora-modules`` as the app starts; a failure is logged by name and stops the start-up."""
    try:
        await state.loras.load_modules(state.config.lora_modules)
    except ConfigError as exc:
        state.startup_error = str(exc)
        log.error("%s", exc)
        raise


def _detokenize(tokens: Tokens, ids: list[int]) -> str:
    return tokens.decode(tokens.check_ids(ids, "tokens"))
