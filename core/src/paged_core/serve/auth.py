"""Bearer-token auth as pure ASGI middleware, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from paged_core.serve.errors import APIError

# Probes and scrapers must work without the key; everything else needs it.
OPEN_PATHS = frozenset({"/health", "/metrics"})


class BearerAuth:
    """Refuses (401) requests whose ``Authorization`` is not ``Bearer <api_key>``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if given is None:
            error = APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                             code="missing_api_key")  # fmt: skip
        elif not hmac.compare_digest(given, self.expected):
            error = APIError(401, "incorrect API key provided", code="invalid_api_key")
        else:
            await self.app(scope, receive, send)
            return
        await error.response()(scope, receive, send)
