"""``GET /health`` answered by a pure ASGI middleware, ahead of auth, routing and every request's work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from paged_core.serve.errors import APIError

Engines = Callable[[], list[dict[str, Any]] | None]


def health_response(healthy: bool, engines: list[dict[str, Any]] | None = None) -> JSONResponse:
    """200 ``{"status": "ok"}`` while the engine runs; a 503 error once it has died.

    With several engine cores (data parallel) the 200 body also lists them, ``{"engine": 1, "pid": ...,
    "status": "dead", "reason": ...}`` for one that died, and ``status`` is ``degraded`` while any is dead:
    the server still serves on the others, so it stays 200 until the last one dies.
    """
    if not healthy:
        return APIError(503, "engine is not running").response()
    if engines is None:
        return JSONResponse({"status": "ok"})
    degraded = any(e.get("status") != "ok" for e in engines)
    return JSONResponse({"status": "degraded" if degraded else "ok", "engines": engines})


class HealthProbe:
    """Answers ``GET /health`` itself: a liveness probe must not queue behind routing, auth or request handling.

    The answer reads one flag of the engine thread, so it takes microseconds of the event loop whatever the
    server is doing (tokenizing and template rendering run on other threads).
    """

    def __init__(self, app: ASGIApp, healthy: Callable[[], bool], engines: Engines | None = None) -> None:
        self.app = app
        self.healthy = healthy
        self.engines = engines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/health":
            engines = self.engines() if self.engines is not None else None
            await health_response(self.healthy(), engines)(scope, receive, send)
            return
        await self.app(scope, receive, send)
