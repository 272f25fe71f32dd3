"""The pluggy hook specification a backend plugin implements.

A plugin is whatever an entry point in the ``paged_core.backends`` group
loads (usually a module) that carries a ``@hookimpl``-decorated
``paged_register_backends`` function::

    from paged_core.api import hookimpl

    @hookimpl
    def paged_register_backends():
        return [MyBackend]
"""

from __future__ import annotations

import pluggy

from paged_core.contract.backend import AttentionBackend

PROJECT_NAME = "paged_core"
"""The pluggy project name; it ties the markers below to the registry's PluginManager."""

ENTRY_POINT_GROUP = "paged_core.backends"
"""The entry-point group third-party backend distributions declare their plugin under."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks hook specifications (used by paged-core only)."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementations; vendors import it from :mod:`paged_core.api`."""


@hookspec
def paged_register_backends() -> list[type[AttentionBackend]]:  # type: ignore[empty-body]
    """Return the backend classes this plugin provides.

    Called once per plugin when the registry loads. Return classes, not
    instances; the registry asks each one for ``availability()`` and
    ``capabilities()`` without constructing it. Do no heavy work here.
    """
