"""The OpenAPI document: the routes' real request bodies, success bodies and error responses.

The routes read their bodies by hand (:func:`~paged_core.serve.body.parse_body`
gives clearer errors than FastAPI's), so FastAPI alone would document no
request body at all, and no schema-driven client or fuzzer could exercise
the real inputs. Each route's decorator passes one of the ``openapi_extra``
dicts below; :func:`install_openapi` puts the pydantic models they refer to
under ``components/schemas``. The response models are documentation only:
the routes build their JSON by hand, and the schema test holds them to it.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from paged_core.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
)

_REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(BaseModel):
    """Every error response: ``{"error": {...}}``."""

    error: ErrorDetail


class Usage(BaseModel):
    """Token counts of a response."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class CompletionChoice(BaseModel):
    """One choice of ``/v1/completions``."""

    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_token_ids: list[int] | None = None
    """With ``return_token_ids``: this choice's prompt as token ids."""
    token_ids: list[int] | None = None
    """With ``return_token_ids``: the generated token ids."""


class CompletionResponse(BaseModel):
    """A non-streaming ``/v1/completions`` answer (``stream: true`` answers ``text/event-stream``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    """The generated turn."""

    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """Calls read from the text (the tool-call parser's under ``auto``, the grammar's under ``required`` or a named
    function), in OpenAI's shape."""


class ChatChoice(BaseModel):
    """One choice of ``/v1/chat/completions``."""

    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None
    """With ``return_token_ids``: the generated token ids."""


class ChatCompletionResponse(BaseModel):
    """A non-streaming ``/v1/chat/completions`` answer (``stream: true`` answers ``text/event-stream``)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None
    """With ``return_token_ids``: the rendered conversation as token ids."""


class ModelCard(BaseModel):
    """A served model: the base model, or a LoRA adapter over it (``parent`` names the base, ``root`` is the
    adapter's path)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    root: str | None = None
    parent: str | None = None


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    """``POST /tokenize``."""

    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    """``POST /detokenize``."""

    prompt: str


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    CompletionRequest,
    ChatCompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    ErrorBody,
    CompletionResponse,
    ChatCompletionResponse,
    ModelList,
    TokenizeResponse,
    DetokenizeResponse,
)

_ERRORS = {
    400: "Invalid request: malformed JSON, wrong type, unknown field, value out of range, prompt too long.",
    401: "Missing or wrong API key (with --api-key).",
    404: "Unknown model (or LoRA adapter).",
    413: "Body over --max-body-bytes.",
    429: "Server at capacity (max_num_seqs + max_queued_requests sequences in flight); see Retry-After.",
    500: "Internal error; the body carries an id to find in the server log.",
    503: "The engine is not running.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _errors(codes: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for code in codes:
        out[str(code)] = {"description": _ERRORS[code], "content": {"application/json": {"schema": _ref(ErrorBody)}}}
        if code == 429:
            out[str(code)]["headers"] = _RETRY_AFTER
    return out


def operation(
    request: type[BaseModel] | None, success: dict[str, Any], errors: tuple[int, ...], secured: bool = True
) -> dict[str, Any]:
    """An ``openapi_extra`` dict: the request body (if any), the 200's content by media type, and ``errors``."""
    extra: dict[str, Any] = {"responses": {"200": {"content": success}, **_errors(errors)}}
    if request is not None:
        extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(request)}}}
    if not secured:
        extra["security"] = []  # probes and scrapers: open even with --api-key
    return extra


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


# No type: schema checkers validate each event's data against it, and the events are JSON chunks then "[DONE]".
_STREAM = {"text/event-stream": {"schema": {"description": "Server-sent events: JSON chunks, then data: [DONE]"}}}
_POST_ERRORS = (400, 401, 404, 413, 500, 503)
_GENERATION_ERRORS = (400, 401, 404, 413, 429, 500, 503)

COMPLETIONS = operation(CompletionRequest, {**_json(CompletionResponse), **_STREAM}, _GENERATION_ERRORS)
CHAT_COMPLETIONS = operation(ChatCompletionRequest, {**_json(ChatCompletionResponse), **_STREAM}, _GENERATION_ERRORS)
TOKENIZE = operation(TokenizeRequest, _json(TokenizeResponse), _POST_ERRORS)
DETOKENIZE = operation(DetokenizeRequest, _json(DetokenizeResponse), _POST_ERRORS)
MODELS = operation(None, _json(ModelList), (401, 500))
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
LOAD_LORA = operation(LoadLoRAAdapterRequest, _TEXT, (400, 401, 413, 500, 503))
UNLOAD_LORA = operation(UnloadLoRAAdapterRequest, _TEXT, (400, 401, 404, 413, 500, 503))
HEALTH = operation(None, {"application/json": {"schema": {"type": "object"}}}, (500, 503), secured=False)
METRICS = operation(None, {"text/plain": {"schema": {"type": "string"}}}, (500,), secured=False)


def install_openapi(app: FastAPI, api_key: bool) -> None:
    """Add the models to ``components/schemas`` (and bearer auth when ``api_key``) to ``app``'s document."""
    generate = app.openapi

    def document() -> dict[str, Any]:
        schema = generate()  # FastAPI caches it, so this extends the cached document once
        components = schema.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        if "ErrorBody" not in schemas:
            pairs = [(m, "validation") for m in REQUEST_MODELS] + [(m, "serialization") for m in RESPONSE_MODELS]
            keyed, defs = models_json_schema(pairs, ref_template=_REF)  # type: ignore[arg-type]
            schemas.update(defs.get("$defs", {}))
            for (model, _mode), entry in keyed.items():
                if "$ref" in entry:
                    continue
                schemas[model.__name__] = entry  # a model pydantic inlined rather than referenced
            if api_key:
                components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
        return schema

    app.openapi = document  # type: ignore[method-assign]
