"""Allow-list, deny-list and kill switch: what loads, what is never imported, and the reasons shown."""

from __future__ import annotations

import pytest

from paged_core.api import ConfigError
from paged_core.registry import BackendStatus, PluginFilter


@pytest.fixture
def three(plugins, make_backend):
    """A built-in plus two third-party plugins, and one entry point whose import would fail."""
    plugins.provides("fake_core", make_backend("core"))
    plugins.provides("fake_alpha", make_backend("alpha"))
    plugins.provides("fake_beta", make_backend("beta-kernel"))
    plugins.dist("paged-backend-alpha", alpha="fake_alpha")
    plugins.dist("paged-backend-beta", beta="fake_beta")
    plugins.dist("paged-backend-ghost", ghost="fake_ghost_module_missing")

    def statuses():
        registry = plugins.registry(builtins={"core": "fake_core"})
        return {r.name: (r.status, r.reason) for r in registry.records()}

    return statuses


def test_no_filters(three) -> None:
    got = three()
    assert got["ghost"][0] is BackendStatus.LOAD_ERROR
    assert {got[n][0] for n in ("core", "alpha", "beta-kernel")} == {BackendStatus.LOADED}


def test_deny_by_entry_point_name_skips_import(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_DENY", "ghost, alpha")
    got = three()
    # a LOAD_ERROR here would mean the denied entry point was imported
    assert got["ghost"] == (BackendStatus.DISABLED, "denied by PAGED_BACKENDS_DENY (matches 'ghost')")
    assert got["alpha"][0] is BackendStatus.DISABLED
    assert got["beta-kernel"][0] is BackendStatus.LOADED


def test_deny_matches_distribution_names_loosely(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_DENY", "Paged_Backend.Ghost")
    assert three()["ghost"][0] is BackendStatus.DISABLED


def test_deny_by_backend_name(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_DENY", "beta-kernel,core")
    got = three()
    assert got["beta-kernel"] == (BackendStatus.DISABLED, "denied by PAGED_BACKENDS_DENY (matches 'beta-kernel')")
    assert got["core"][0] is BackendStatus.DISABLED
    assert got["alpha"][0] is BackendStatus.LOADED


def test_allow_by_entry_point_skips_everything_else_unimported(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_ALLOW", "alpha")
    got = three()
    assert got["alpha"][0] is BackendStatus.LOADED
    assert got["ghost"] == (BackendStatus.DISABLED, "not in PAGED_BACKENDS_ALLOW")
    assert got["beta"] == (BackendStatus.DISABLED, "not in PAGED_BACKENDS_ALLOW")  # named by entry point: not imported
    assert got["core"][0] is BackendStatus.DISABLED


def test_allow_by_backend_name_imports_to_find_it(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_ALLOW", "beta-kernel")
    got = three()
    assert got["beta-kernel"][0] is BackendStatus.LOADED
    assert got["alpha"] == (BackendStatus.DISABLED, "not in PAGED_BACKENDS_ALLOW")
    assert got["ghost"][0] is BackendStatus.DISABLED


def test_deny_beats_allow(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_ALLOW", "alpha,beta")
    monkeypatch.setenv("PAGED_BACKENDS_DENY", "alpha")
    got = three()
    assert got["alpha"][0] is BackendStatus.DISABLED and got["beta-kernel"][0] is BackendStatus.LOADED


def test_empty_allow_list_counts_as_unset(three, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKENDS_ALLOW", " , ")
    assert three()["alpha"][0] is BackendStatus.LOADED


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_kill_switch_keeps_builtins_only(three, monkeypatch, value) -> None:
    monkeypatch.setenv("PAGED_DISABLE_PLUGINS", value)
    got = three()
    assert got["core"][0] is BackendStatus.LOADED
    for name in ("alpha", "beta", "ghost"):  # entry-point names: none was imported
        assert got[name][0] is BackendStatus.DISABLED
        assert "PAGED_DISABLE_PLUGINS" in got[name][1]


@pytest.mark.parametrize("value", ["0", "false", "", "off"])
def test_kill_switch_off_values(three, monkeypatch, value) -> None:
    monkeypatch.setenv("PAGED_DISABLE_PLUGINS", value)
    assert three()["alpha"][0] is BackendStatus.LOADED


def test_kill_switch_garbage_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("PAGED_DISABLE_PLUGINS", "maybe")
    with pytest.raises(ConfigError, match=r"PAGED_DISABLE_PLUGINS='maybe'.*1/true"):
        PluginFilter.from_env({"PAGED_DISABLE_PLUGINS": "maybe"})
