"""Turn one backend class into a :class:`BackendRecord` by the registry's status rules."""

from __future__ import annotations

import inspect

from paged_core.contract.backend import AttentionBackend, Availability
from paged_core.contract.capabilities import BackendCapabilities
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.registry.record import BackendRecord, BackendStatus, describe_exception, one_line
from paged_core.registry.source import PluginSource


def _api_mismatch(api: object) -> str:
    supported = ", ".join(f"v{v}" for v in sorted(SUPPORTED_PLUGIN_API_VERSIONS))
    return f"written for plugin API v{api}; this paged-core implements v{PLUGIN_API_VERSION} and accepts {supported}"


def _capabilities(cls: type[AttentionBackend]) -> tuple[BackendCapabilities | None, str]:
    """The declared capabilities, or ``None`` and why they could not be read."""
    try:
        caps = cls.capabilities()
    except (Exception, SystemExit) as exc:  # a vendor bug must only break this backend
        return None, f"capabilities() raised {describe_exception(exc)}"
    if not isinstance(caps, BackendCapabilities):
        return None, f"capabilities() returned {type(caps).__name__}, expected BackendCapabilities"
    return caps, ""


def classify(source: PluginSource, cls: type[AttentionBackend]) -> BackendRecord:
    """Check one backend class: name, API version, completeness, availability, capabilities.

    Nothing is constructed; only the class methods ``availability`` and
    ``capabilities`` are called, each inside its own try/except.
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        reason = f"backend class {cls.__qualname__} has no valid 'name' (got {name!r})"
        return source.record(source.name, BackendStatus.LOAD_ERROR, reason, backend_cls=cls)
    priority = getattr(cls, "priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        reason = f"backend class {cls.__qualname__} has a non-integer priority {priority!r}"
        return source.record(name, BackendStatus.LOAD_ERROR, reason, backend_cls=cls)

    def rec(status: BackendStatus, reason: str = "", **fields: object) -> BackendRecord:
        return source.record(name, status, reason, priority=priority, backend_cls=cls, **fields)

    api = getattr(cls, "api_version", None)
    if api is None:
        reason = (
            f"backend class {cls.__qualname__} does not declare api_version (the plugin API version it was "
            f"written for; this paged-core implements v{PLUGIN_API_VERSION}): set api_version = "
            f"{PLUGIN_API_VERSION} in its class body"
        )
        return rec(BackendStatus.LOAD_ERROR, reason)
    if isinstance(api, bool) or not isinstance(api, int) or api not in SUPPORTED_PLUGIN_API_VERSIONS:
        return rec(BackendStatus.API_MISMATCH, _api_mismatch(api))
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        return rec(BackendStatus.LOAD_ERROR, f"backend class {cls.__qualname__} leaves abstract methods: {missing}")

    try:
        avail = cls.availability()
    except (Exception, SystemExit) as exc:  # a vendor bug must only break this backend
        return rec(BackendStatus.UNAVAILABLE, f"availability check raised {describe_exception(exc)}")
    if not isinstance(avail, Availability):
        return rec(BackendStatus.UNAVAILABLE, f"availability() returned {type(avail).__name__}, expected Availability")

    caps, caps_problem = _capabilities(cls)
    if not avail.available:
        reason = one_line(str(avail.reason or "")) or "availability() said no without giving a reason"
        return rec(BackendStatus.UNAVAILABLE, reason, device=avail.device, capabilities=caps)
    if caps is None:
        return rec(BackendStatus.UNAVAILABLE, caps_problem, device=avail.device)
    return rec(BackendStatus.LOADED, device=avail.device, capabilities=caps)
