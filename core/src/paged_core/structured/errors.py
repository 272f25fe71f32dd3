"""The errors of a constraint: each names the :class:`.StructuredOutputs` field it comes from."""

from __future__ import annotations

from paged_core.errors import RequestRejectedError


class ConstraintError(RequestRejectedError):
    """A constraint cannot be served: missing, several at once, malformed or too large. ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"structured_outputs.{field}: {message}")


class ConstraintCompileError(ConstraintError):
    """The grammar engine refused the constraint (an invalid schema, regex or grammar, or past its limits)."""


class ConstraintTimeoutError(ConstraintError):
    """The constraint did not compile within the compiler's timeout."""
