"""The backend registry: pluggy hook specs, entry-point loading, status records and selection."""

from __future__ import annotations

from paged_core.registry.filters import ENV_ALLOW, ENV_BACKEND, ENV_DENY, ENV_DISABLE_PLUGINS, PluginFilter
from paged_core.registry.hookspecs import ENTRY_POINT_GROUP, hookimpl, hookspec
from paged_core.registry.record import BackendRecord, BackendStatus
from paged_core.registry.registry import BackendRegistry, load_registry
from paged_core.registry.source import BUILTIN_PLUGINS, PluginSource

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "ENV_ALLOW",
    "ENV_BACKEND",
    "ENV_DENY",
    "ENV_DISABLE_PLUGINS",
    "BackendRecord",
    "BackendRegistry",
    "BackendStatus",
    "PluginFilter",
    "PluginSource",
    "hookimpl",
    "hookspec",
    "load_registry",
]
