"""Bearer-token auth as pure ASGI middleware, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from paged_core.serve.errors import APIError

# Probes and scrapers must work without the key; everything else needs it, whatever the method: letting OPTIONS
# through would tell an anonymous caller which routes exist (405 for a real route, 404 for none).
OPEN_PATHS = frozenset({"/health", "/metrics"})


def bearer_token(header: bytes) -> bytes | None:
    """The credentials of a ``Bearer`` Authorization header, None for another scheme.

    The scheme is case-insensitive (RFC 7235 section 2.1), so ``bearer`` and ``BEARER`` work too.
    """
    scheme, _, rest = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return rest.strip(b" ")


class BearerAuth:
    """Refuses (401) requests whose ``Authorization`` is not ``Bearer <api_key>``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if given is None:
            error = APIError(
                401, "missing API key: send the header 'Authorization: Bearer <key>'", code="missing_api_key"
            )
        else:
            token = bearer_token(given)
            # Compared even when the scheme is wrong, so the time taken does not tell the two failures apart.
            match = hmac.compare_digest(token if token is not None else given, self.expected)
            if token is not None and match:
                await self.app(scope, receive, send)
                return
            error = APIError(401, "incorrect API key provided", code="invalid_api_key")
        await error.response()(scope, receive, send)
