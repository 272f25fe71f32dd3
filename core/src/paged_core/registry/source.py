"""Where a plugin comes from: an installed distribution's entry point, or a core built-in."""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass

from paged_core._version import __version__
from paged_core.registry.hookspecs import ENTRY_POINT_GROUP
from paged_core.registry.record import BackendRecord, BackendStatus

CORE_DISTRIBUTION = "paged-core"

BUILTIN_PLUGINS: dict[str, str] = {"reference": "paged_core.reference.plugin"}
"""Plugins core registers itself, by name: imported lazily, loaded even with the kill switch on."""


@dataclass(frozen=True)
class PluginSource:
    """One plugin to load: ``value`` is ``"module"`` or ``"module:attribute"``."""

    name: str
    value: str
    distribution: str | None = None
    version: str | None = None
    builtin: bool = False

    @classmethod
    def from_entry_point(cls, ep: md.EntryPoint) -> PluginSource:
        """Describe an entry point; its distribution is unknown when it was built by hand (tests)."""
        dist = getattr(ep, "dist", None)
        name = dist.metadata["Name"] if dist is not None else None
        return cls(ep.name, ep.value, name, dist.version if dist is not None else None)

    @classmethod
    def builtin_plugin(cls, name: str, value: str) -> PluginSource:
        """A plugin shipped inside paged-core itself."""
        return cls(name, value, CORE_DISTRIBUTION, __version__, builtin=True)

    @property
    def keys(self) -> tuple[str | None, str | None]:
        """The names allow/deny entries can match before import."""
        return (self.name, self.distribution)

    def load(self) -> object:
        """Import the plugin object; raises whatever the import raises."""
        return md.EntryPoint(self.name, self.value, ENTRY_POINT_GROUP).load()

    def record(self, name: str, status: BackendStatus, reason: str = "", **fields: object) -> BackendRecord:
        """A record stamped with this source's provenance."""
        return BackendRecord(
            name=name,
            status=status,
            reason=reason,
            distribution=self.distribution,
            distribution_version=self.version,
            entry_point=None if self.builtin else self.name,
            builtin=self.builtin,
            **fields,  # type: ignore[arg-type]
        )
