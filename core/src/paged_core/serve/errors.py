"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with a proper status code."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paged_core.errors import PagedError

log = logging.getLogger("paged.serve")

# OpenAI's error types by status; clients switch on these.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}  # fmt: skip
_FIELD = re.compile(r"SamplingParams\.(\w+)")


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

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """This error as a response; 401s carry the header HTTP requires."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def rejected(exc: PagedError) -> APIError:
    """A 400 for a request the engine or :class:`SamplingParams` refused; ``param`` names the field if known."""
    message = str(exc)
    match = _FIELD.search(message)
    param = match.group(1) if match else None
    return APIError(400, message.replace("SamplingParams.", ""), param=param)


def install_handlers(app: FastAPI) -> None:
    """Answer every error (ours, routing's, and unexpected ones) in OpenAI's shape."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response()

    async def on_paged_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PagedError)
        return rejected(exc).response()

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        message = {404: f"no route {path}", 405: f"method {request.method} not allowed on {path}"}
        return APIError(exc.status_code, message.get(exc.status_code, str(exc.detail))).response()

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error ({type(exc).__name__})", type="server_error").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(PagedError, on_paged_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
