"""Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``, registered for ``/v1/messages``.

Every error on these paths takes it, wherever it is raised (body parsing, auth, admission, the engine), since
:func:`~paged_core.serve.errors.register_shape` hooks it into :class:`~paged_core.serve.errors.APIError`.
"""

from __future__ import annotations

from typing import Any

from paged_core.serve.errors import APIError, register_shape

PATH = "/v1/messages"

# Anthropic's error types by status; its clients pick their exception class by the status.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",  # the engine is down or shutting down: retry elsewhere or later
}


def error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status."""
    return TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_body(error: APIError) -> dict[str, Any]:
    """``error`` in Anthropic's shape; the message starts with the field it concerns unless it names it already."""
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": error_type(error.status), "message": message}}


register_shape(PATH, anthropic_body)
