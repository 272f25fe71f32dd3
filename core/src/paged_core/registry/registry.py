"""The backend registry: discovery, per-plugin isolation, and backend selection."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata as md
import os
import threading
from collections.abc import Iterable, Mapping

import pluggy

from paged_core.contract.backend import AttentionBackend
from paged_core.errors import BackendNotFoundError, BackendUnavailableError
from paged_core.registry.duplicates import mark_duplicates
from paged_core.registry.filters import ENV_BACKEND, PluginFilter
from paged_core.registry.hookspecs import ENTRY_POINT_GROUP
from paged_core.registry.loader import load_source, new_plugin_manager
from paged_core.registry.record import BackendRecord, BackendStatus
from paged_core.registry.source import BUILTIN_PLUGINS, PluginSource


class BackendRegistry:
    """Every discovered backend with its status; picks the one to run.

    Build it with :func:`load_registry` (installed entry points, cached per
    process) or :meth:`from_entry_points` (an explicit list, for tests and
    tools). Loading never raises for a broken plugin: each problem becomes a
    record that ``paged backends`` shows.
    """

    def __init__(self, records: Iterable[BackendRecord], plugin_manager: pluggy.PluginManager | None = None) -> None:
        self._records = list(records)
        # Every plugin that passed validation is registered here under its entry-point name.
        self.plugin_manager = plugin_manager if plugin_manager is not None else new_plugin_manager()

    @classmethod
    def from_entry_points(
        cls,
        entry_points: Iterable[md.EntryPoint | PluginSource],
        *,
        builtins: Mapping[str, str] = BUILTIN_PLUGINS,
    ) -> BackendRegistry:
        """Load built-ins, then each entry point, each in isolation, honouring the filter variables.

        ``builtins`` maps a name to a ``"module[:attribute]"`` plugin path;
        built-ins belong to paged-core, survive ``PAGED_DISABLE_PLUGINS`` and
        win name clashes. Raises :class:`~paged_core.errors.ConfigError` only
        for a malformed filter variable.
        """
        filt = PluginFilter.from_env(os.environ)
        sources = [PluginSource.builtin_plugin(name, value) for name, value in builtins.items()]
        sources += [ep if isinstance(ep, PluginSource) else PluginSource.from_entry_point(ep) for ep in entry_points]
        all_keys = [key for src in sources for key in src.keys if key]
        pm = new_plugin_manager()
        records: list[BackendRecord] = []
        for src in sources:
            skip = filt.skip_before_import(src.keys, src.builtin, all_keys)
            if skip is not None:
                records.append(src.record(src.name, BackendStatus.DISABLED, skip))
                continue
            for rec in load_source(pm, src):
                skip = filt.skip_after_import((rec.name, *src.keys))
                if skip is not None:
                    rec = dataclasses.replace(rec, status=BackendStatus.DISABLED, reason=skip)
                records.append(rec)
        return cls(mark_duplicates(records), plugin_manager=pm)

    @classmethod
    def discover(cls) -> BackendRegistry:
        """Scan the installed ``paged_core.backends`` entry points (uncached; see :func:`load_registry`)."""
        return cls.from_entry_points(md.entry_points(group=ENTRY_POINT_GROUP))

    def records(self) -> list[BackendRecord]:
        """All records: loaded ones by priority (highest first, then name), then the rest by name."""
        loaded = sorted((r for r in self._records if r.selectable), key=lambda r: (-r.priority, r.name))
        rest = sorted((r for r in self._records if not r.selectable), key=lambda r: (r.name, r.status.value))
        return loaded + rest

    def names(self) -> list[str]:
        """Every known name (backends and entry points that failed before naming one), sorted."""
        return sorted({r.name for r in self._records})

    def get(self, name: str) -> type[AttentionBackend]:
        """The loaded backend called ``name``.

        Raises :class:`BackendNotFoundError` naming the known backends, or
        :class:`BackendUnavailableError` with the recorded reason when the
        name is known but not usable here.
        """
        matches = [r for r in self._records if r.name == name]
        if not matches:
            raise BackendNotFoundError(self._not_found_message(name))
        for rec in matches:
            if rec.selectable and rec.backend_cls is not None:
                return rec.backend_cls
        why = "; ".join(f"{r.status.value} ({r.source}): {r.reason}" for r in matches)
        raise BackendUnavailableError(f"backend {name!r} cannot be used: {why}")

    def select(self, explicit: str | None = None) -> type[AttentionBackend]:
        """The backend to run: ``explicit``, else ``$PAGED_BACKEND``, else the highest-priority loaded one.

        Priority ties go to the alphabetically first name, so the choice does
        not depend on install order.
        """
        wanted = (explicit or "").strip() or os.environ.get(ENV_BACKEND, "").strip()
        if wanted:
            return self.get(wanted)
        loaded = self.records()
        if loaded and loaded[0].selectable and loaded[0].backend_cls is not None:
            return loaded[0].backend_cls
        if not loaded:
            raise BackendUnavailableError("no backend is installed (not even the built-in reference backend)")
        why = "; ".join(f"{r.name} ({r.status.value}): {r.reason}" for r in loaded)
        raise BackendUnavailableError(f"no backend is available here: {why}")

    def _not_found_message(self, name: str) -> str:
        known = self.names()
        if not known:
            return f"unknown backend {name!r}; no backends are known"
        close = [k for k in known if k.lower() == name.lower()] or difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown backend {name!r}{hint}; known backends: {', '.join(known)}"


_lock = threading.Lock()
_cached: BackendRegistry | None = None


def load_registry(*, refresh: bool = False) -> BackendRegistry:
    """The process-wide registry of installed backends; ``refresh=True`` rescans (e.g. after changing env vars)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = BackendRegistry.discover()
        return _cached
