"""API-key auth (``Authorization: Bearer`` or Anthropic's ``x-api-key``) as pure ASGI middleware, in constant time."""

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
    """Refuses (401) requests whose ``Authorization`` is not ``Bearer <api_key>`` and whose ``x-api-key`` (the header
    Anthropic's clients send) is not ``<api_key>``; either one right is enough."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        api_key = next((v for k, v in scope["headers"] if k == b"x-api-key"), None)
        if given is None and api_key is None:
            error = APIError(
                401,
                "missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                code="missing_api_key",
            )
        else:
            match = api_key is not None and hmac.compare_digest(api_key, self.expected)
            if given is not None:
                token = bearer_token(given)
                # Compared even when the scheme is wrong, so the time taken does not tell the two failures apart.
                bearer = hmac.compare_digest(token if token is not None else given, self.expected)
                match = match or (token is not None and bearer)
            if match:
                await self.app(scope, receive, send)
                return
            error = APIError(401, "incorrect API key provided", code="invalid_api_key")
        await error.response(scope["path"])(scope, receive, send)
