"""Exceptions raised by paged-core, all rooted at :class:`PagedError`."""

from __future__ import annotations


class PagedError(Exception):
    """Base class of every error paged-core raises on purpose."""


class ConfigError(PagedError, ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""


class RequestRejectedError(PagedError, ValueError):
    """A request can never be served (too long, or larger than the whole KV cache)."""


class UnsupportedConfigError(PagedError, ValueError):
    """A backend was asked for a dtype, head size, block size or feature it does not declare."""


class BackendNotFoundError(PagedError, LookupError):
    """No backend of that name is known; the message lists the known ones."""


class BackendUnavailableError(PagedError, RuntimeError):
    """The backend exists but cannot run here; the message says why."""


class EngineDeadError(PagedError, RuntimeError):
    """The engine core stopped (its process died, or its thread broke); no request can be served."""


class DistributedError(PagedError, RuntimeError):
    """A tensor-parallel rank died or a collective timed out: the ranks are out of step, so the engine ends."""


class WeightFormatError(PagedError, ValueError):
    """A packed weight is malformed (size, block count, shape) or of a type nothing here can read; names the tensor."""
