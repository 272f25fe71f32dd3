"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with a proper status code."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from paged_core.errors import PagedError

log = logging.getLogger("paged.serve")

# OpenAI's error types by status; clients switch on these.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}
_FIELD = re.compile(r"SamplingParams\.(\w+)")
# Paths answered in another API's error shape (Anthropic's /v1/messages), each with the body it makes of an error.
_SHAPES: dict[str, Callable[[APIError], dict[str, Any]]] = {}


def register_shape(prefix: str, body: Callable[[APIError], dict[str, Any]]) -> None:
    """Answer errors on ``prefix`` and the paths below it with ``body(error)`` instead of OpenAI's shape."""
    _SHAPES[prefix] = body


def _shape(path: str) -> Callable[[APIError], dict[str, Any]] | None:
    for prefix, body in _SHAPES.items():
        if path == prefix or path.startswith(prefix + "/"):
            return body
    return None


class APIError(Exception):
    """An error answered to the client as OpenAI's error JSON."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self, path: str = "") -> dict[str, Any]:
        """The JSON body OpenAI clients parse (or the shape registered for ``path``, see :func:`register_shape`)."""
        shape = _shape(path)
        if shape is not None:
            return shape(self)
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, path: str = "") -> JSONResponse:
        """This error as a response to a request for ``path``; 401s carry the header HTTP requires."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(path), status_code=self.status, headers=headers)


def rejected(exc: PagedError) -> APIError:
    """A 400 for a request the engine or :class:`SamplingParams` refused; ``param`` names the field if known."""
    message = str(exc)
    match = _FIELD.search(message)
    param = match.group(1) if match else None
    return APIError(400, message.replace("SamplingParams.", ""), param=param)


def internal_error(exc: BaseException, where: str) -> APIError:
    """A 500 for an unexpected failure, logged here once with its traceback under a fresh error id.

    The body carries only that id: an exception's text can hold paths, reprs of internal objects or other
    tenants' data, so it goes to the log, never to the client.
    """
    error_id = uuid.uuid4().hex[:16]
    log.error("internal error %s in %s", error_id, where, exc_info=(type(exc), exc, exc.__traceback__))
    return APIError(
        500,
        f"internal server error (error id {error_id}); the server log has the details",
        type="server_error",
        code="internal_error",
    )


class CatchUnexpected:
    """Pure ASGI middleware answering any exception that escapes a route with a 500 carrying an error id.

    Starlette's own last-resort handler re-raises after answering, so uvicorn logs a second traceback and
    drops the keep-alive connection; catching here, inside it, logs once and keeps the connection usable.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            error = internal_error(exc, f"{scope['method']} {scope['path']}")
            if not started:  # once a response is under way the client cannot be told; the log has it
                await error.response(scope["path"])(scope, receive, send)


def install_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape (unexpected ones through :class:`CatchUnexpected`)."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response(request.url.path)

    async def on_paged_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PagedError)
        return rejected(exc).response(request.url.path)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        message = {404: f"no route {path}", 405: f"method {request.method} not allowed on {path}"}
        return APIError(exc.status_code, message.get(exc.status_code, str(exc.detail))).response(path)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(PagedError, on_paged_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
