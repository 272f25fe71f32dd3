"""The reference plugin module registers ReferenceBackend through the pluggy hook."""

from __future__ import annotations

import pluggy

from paged_core.reference import ReferenceBackend, plugin
from paged_core.registry import hookspecs


def test_hookimpl_returns_reference_backend() -> None:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    manager.register(plugin)
    results = manager.hook.paged_register_backends()
    assert results == [[ReferenceBackend]]
