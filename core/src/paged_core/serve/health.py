"""``GET /health`` answered by a pure ASGI middleware, ahead of auth, routing and every request's work."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from paged_core.serve.errors import APIError


def health_response(healthy: bool) -> JSONResponse:
    """200 ``{"status": "ok"}`` while the engine thread runs; a 503 error once it has died."""
    if healthy:
        return JSONResponse({"status": "ok"})
    return APIError(503, "engine is not running").response()


class HealthProbe:
    """Answers ``GET /health`` itself: a liveness probe must not queue behind routing, auth or request handling.

    The answer reads one flag of the engine thread, so it takes microseconds of the event loop whatever the
    server is doing (tokenizing and template rendering run on other threads).
    """

    def __init__(self, app: ASGIApp, healthy: Callable[[], bool]) -> None:
        self.app = app
        self.healthy = healthy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/health":
            await health_response(self.healthy())(scope, receive, send)
            return
        await self.app(scope, receive, send)
