"""What the registry knows about one discovered backend: :class:`BackendRecord`."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import BackendCapabilities


class BackendStatus(str, enum.Enum):
    """Outcome of loading one backend (or one plugin that produced no backend)."""

    LOADED = "loaded"
    """Imported, API-compatible and available here: selectable."""
    UNAVAILABLE = "unavailable"
    """Loaded fine but cannot run on this machine (or its availability check raised)."""
    LOAD_ERROR = "load-error"
    """The plugin failed to import, failed hook validation, raised, or returned junk."""
    API_MISMATCH = "api-mismatch"
    """Written for a plugin API version this core no longer (or not yet) supports."""
    DUPLICATE = "duplicate"
    """Another source provides a backend of the same name."""
    DISABLED = "disabled"
    """Filtered out by ``PAGED_BACKENDS_ALLOW``/``_DENY`` or ``PAGED_DISABLE_PLUGINS``."""


@dataclass
class BackendRecord:
    """One row of ``paged backends``: a backend, or a plugin that failed before naming one.

    ``name`` is the backend's name when known, else the entry point's name.
    ``reason`` is a single line, empty for loaded backends. ``builtin`` marks
    backends core registers itself (they win name clashes with third parties).
    """

    name: str
    status: BackendStatus
    distribution: str | None = None
    distribution_version: str | None = None
    entry_point: str | None = None
    priority: int = 0
    device: str | None = None
    reason: str = ""
    backend_cls: type[AttentionBackend] | None = None
    capabilities: BackendCapabilities | None = None
    builtin: bool = False

    @property
    def selectable(self) -> bool:
        """Whether :meth:`BackendRegistry.get` may return this backend."""
        return self.status is BackendStatus.LOADED and self.backend_cls is not None

    @property
    def source(self) -> str:
        """Where the record came from, for messages: ``dist 1.0 (entry point 'x')``."""
        dist = self.distribution or "unknown distribution"
        if self.distribution_version:
            dist = f"{dist} {self.distribution_version}"
        if self.builtin:
            return f"{dist} (built-in)"
        return f"{dist} (entry point {self.entry_point!r})"

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view, used by ``paged backends --json``."""
        cls = self.backend_cls
        return {
            "name": self.name,
            "status": self.status.value,
            "priority": self.priority,
            "device": self.device,
            "distribution": self.distribution,
            "distribution_version": self.distribution_version,
            "entry_point": self.entry_point,
            "builtin": self.builtin,
            "backend": f"{cls.__module__}.{cls.__qualname__}" if cls is not None else None,
            "api_version": getattr(cls, "api_version", None) if cls is not None else None,
            "capabilities": self.capabilities.to_dict() if self.capabilities is not None else None,
            "reason": self.reason,
        }


def one_line(text: str, limit: int = 300) -> str:
    """Collapse ``text`` to its first non-empty line, cut at ``limit`` characters (reasons stay one line)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def describe_exception(exc: BaseException) -> str:
    """``"<Type>: <first line of message>"``; multi-line messages whose first line is vague are joined."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # pluggy's validation errors put the actual problem on the last line, so keep them all.
    text = "; ".join(lines) if type(exc).__name__ == "PluginValidationError" else (lines[0] if lines else "")
    name = type(exc).__name__
    return one_line(f"{name}: {text}" if text else name, limit=400)
