"""build_app: the FastAPI application around one engine (routes, auth, errors, metrics, lifecycle)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from paged_core.serve import chat, completions
from paged_core.serve.async_engine import AsyncEngine
from paged_core.serve.auth import BearerAuth
from paged_core.serve.body import parse_body
from paged_core.serve.config import ServeConfig
from paged_core.serve.errors import APIError, install_handlers
from paged_core.serve.metrics import ServerMetrics
from paged_core.serve.protocol import DetokenizeRequest, TokenizeRequest
from paged_core.serve.state import ServerState, get_state
from paged_core.serve.tokens import Tokens


def build_app(engine: Any, config: ServeConfig | None = None) -> FastAPI:
    """An OpenAI-compatible app serving ``engine`` (an :class:`LLMEngine`); the engine thread runs while it does."""
    config = config or ServeConfig()
    aengine = AsyncEngine(engine)
    metrics = ServerMetrics(lambda: aengine.stats)
    aengine.observer = metrics.observe
    vocab = int(engine.loaded.model.config.get_text_config().vocab_size)
    state = ServerState(
        config=config, engine=aengine, metrics=metrics, tokens=Tokens(engine.tokenizer, vocab),
        model_name=config.served_model_name or engine.loaded.source.name, max_model_len=int(engine.scheduler.max_len),
    )  # fmt: skip

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        aengine.start()
        try:
            yield
        finally:
            aengine.stop()

    app = FastAPI(title="paged", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.paged = state
    install_handlers(app)
    if config.api_key:
        app.add_middleware(BearerAuth, api_key=config.api_key)
    app.include_router(completions.router)
    app.include_router(chat.router)
    _add_info_routes(app)
    return app


def _add_info_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        """200 while the engine thread runs; 503 once it has died."""
        if get_state(request).engine.healthy:
            return Response(status_code=200)
        raise APIError(503, "engine is not running")

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Prometheus exposition text."""
        return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        """The one model this server serves."""
        s = get_state(request)
        card = {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "paged",
                "max_model_len": s.max_model_len}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        """Token ids of ``prompt`` or of ``messages`` through the chat template."""
        s = get_state(request)
        req = await parse_body(request, TokenizeRequest, s.config.max_body_bytes)
        s.check_model(req.model, required=False)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of 'prompt' or 'messages'", param="prompt")
        if req.messages is not None:
            ids = s.tokens.render_chat(req.messages, req.add_generation_prompt)
        else:
            ids = s.tokens.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": s.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        """Text of ``tokens``."""
        s = get_state(request)
        req = await parse_body(request, DetokenizeRequest, s.config.max_body_bytes)
        s.check_model(req.model, required=False)
        ids = s.tokens.check_ids(req.tokens, "tokens")
        return JSONResponse({"prompt": s.tokens.decode(ids)})
