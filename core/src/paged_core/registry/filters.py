"""The environment variables that narrow which backends load, and how they match."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from paged_core.errors import ConfigError

ENV_BACKEND = "PAGED_BACKEND"
"""Explicit backend selection (same as ``--backend``)."""
ENV_ALLOW = "PAGED_BACKENDS_ALLOW"
"""Comma list; when set and non-empty, only matching backends load."""
ENV_DENY = "PAGED_BACKENDS_DENY"
"""Comma list; matching backends never load."""
ENV_DISABLE_PLUGINS = "PAGED_DISABLE_PLUGINS"
"""Kill switch: when true, no third-party entry point is imported; built-ins only."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def normalize(key: str) -> str:
    """Case- and separator-insensitive form, so ``Paged_Backend.CUDA`` matches ``paged-backend-cuda``."""
    return re.sub(r"[-_.]+", "-", key.strip()).lower()


def _split(value: str | None) -> frozenset[str]:
    return frozenset(normalize(item) for item in (value or "").split(",") if item.strip())


def _flag(env: Mapping[str, str], var: str) -> bool:
    raw = env.get(var, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{var}={env[var]!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")


@dataclass(frozen=True)
class PluginFilter:
    """Allow-list, deny-list and kill switch, read from the environment.

    Entries match an entry-point name, a backend name or a distribution name.
    Entry-point and distribution names are known before importing, so a
    plugin filtered by them is never imported. A backend name is only known
    after importing, so an allow-list holding a name that matches no entry
    point or distribution forces the remaining plugins to be imported and
    filtered afterwards.
    """

    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    plugins_disabled: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PluginFilter:
        """Read the filter variables; an empty allow-list counts as unset."""
        allow = _split(env.get(ENV_ALLOW))
        return cls(
            allow=allow or None,
            deny=_split(env.get(ENV_DENY)),
            plugins_disabled=_flag(env, ENV_DISABLE_PLUGINS),
        )

    def skip_before_import(self, keys: Iterable[str | None], builtin: bool, all_keys: Iterable[str]) -> str | None:
        """Why a plugin must not be imported, or ``None``.

        ``keys`` are the plugin's entry-point and distribution names;
        ``all_keys`` are those of every discovered plugin (to tell whether the
        allow-list could name a backend hidden inside some plugin).
        """
        if self.plugins_disabled and not builtin:
            return f"{ENV_DISABLE_PLUGINS} is set: third-party plugins are not imported"
        mine = {normalize(k) for k in keys if k}
        denied = sorted(mine & self.deny)
        if denied:
            return f"denied by {ENV_DENY} (matches {denied[0]!r})"
        if self.allow is not None and not mine & self.allow:
            known = {normalize(k) for k in all_keys}
            if self.allow <= known:  # every entry names a plugin, so this one is surely out
                return f"not in {ENV_ALLOW}"
        return None

    def skip_after_import(self, keys: Iterable[str | None]) -> str | None:
        """Why a loaded record must be disabled, given its backend, entry-point and distribution names."""
        mine = {normalize(k) for k in keys if k}
        denied = sorted(mine & self.deny)
        if denied:
            return f"denied by {ENV_DENY} (matches {denied[0]!r})"
        if self.allow is not None and not mine & self.allow:
            return f"not in {ENV_ALLOW}"
        return None
