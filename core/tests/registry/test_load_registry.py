"""The process-wide registry over the real installed entry points."""

from __future__ import annotations

import pytest

import paged_core.registry.registry as registry_module
from paged_core.api import hookimpl
from paged_core.registry import BackendStatus, load_registry


@pytest.fixture(autouse=True)
def _isolated_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start uncached; monkeypatch restores the previous cache afterwards."""
    monkeypatch.setattr(registry_module, "_cached", None)


def test_installed_registry_loads_and_lists_the_builtin() -> None:
    registry = load_registry(refresh=True)
    builtin = [r for r in registry.records() if r.builtin]
    assert [r.name for r in builtin] == ["reference"]
    # the reference backend may be mid-development; it must be listed either way, and never as a duplicate
    assert builtin[0].status in {BackendStatus.LOADED, BackendStatus.LOAD_ERROR}


def test_cached_until_refresh() -> None:
    first = load_registry()
    assert load_registry() is first
    assert load_registry(refresh=True) is not first


def test_discovers_distributions_on_sys_path(plugins, make_backend, monkeypatch) -> None:
    cls = make_backend("sys-path-backend", priority=1000)
    plugins.module("fake_installed", paged_register_backends=hookimpl(lambda: [cls]))
    plugins.dist("paged-backend-installed", "0.9", installed="fake_installed")
    monkeypatch.syspath_prepend(str(plugins.root))
    registry = load_registry(refresh=True)
    [rec] = [r for r in registry.records() if r.name == "sys-path-backend"]
    assert rec.status is BackendStatus.LOADED
    assert (rec.distribution, rec.entry_point) == ("paged-backend-installed", "installed")
    assert registry.select() is cls
