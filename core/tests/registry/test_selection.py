"""Selection: explicit beats PAGED_BACKEND beats priority; errors name what is known and why."""

from __future__ import annotations

import pytest

from paged_core.api import BackendNotFoundError, BackendUnavailableError
from paged_core.registry import BackendRecord, BackendRegistry, BackendStatus


@pytest.fixture
def registry(plugins, make_backend) -> BackendRegistry:
    """low (1), high (5), tie-b and tie-a (3), down (9, unavailable), a broken entry point."""
    plugins.provides(
        "fake_sel",
        make_backend("low", priority=1),
        make_backend("high", priority=5),
        make_backend("tie-b", priority=3),
        make_backend("tie-a", priority=3),
        make_backend("down", priority=9, available=False, reason="needs an MI300"),
    )
    plugins.dist("dist-sel", sel="fake_sel", broken="fake_sel_missing")
    return plugins.registry()


def test_records_order_loaded_by_priority_then_the_rest(registry) -> None:
    names = [r.name for r in registry.records()]
    assert names == ["high", "tie-a", "tie-b", "low", "broken", "down"]


def test_highest_priority_loaded_wins(registry) -> None:
    assert registry.select().name == "high"


def test_priority_ties_break_by_name(plugins, make_backend) -> None:
    plugins.provides("fake_ties", make_backend("zeta", priority=2), make_backend("eta", priority=2))
    plugins.dist("dist-ties", ties="fake_ties")
    assert plugins.registry().select().name == "eta"


def test_env_beats_priority(registry, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKEND", "low")
    assert registry.select().name == "low"


def test_explicit_beats_env(registry, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKEND", "low")
    assert registry.select("tie-b").name == "tie-b"


def test_blank_explicit_and_env_fall_through(registry, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKEND", "  ")
    assert registry.select("").name == "high"


def test_unknown_name_lists_the_known_ones(registry) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        registry.get("hihg")
    message = str(info.value)
    assert "unknown backend 'hihg'" in message and "did you mean 'high'" in message
    assert "known backends: broken, down, high, low, tie-a, tie-b" in message


def test_unknown_env_backend_is_not_silently_ignored(registry, monkeypatch) -> None:
    monkeypatch.setenv("PAGED_BACKEND", "cuda")
    with pytest.raises(BackendNotFoundError, match="known backends"):
        registry.select()


def test_unavailable_explicit_backend_carries_the_reason(registry) -> None:
    with pytest.raises(BackendUnavailableError, match=r"backend .down. cannot be used: unavailable.*needs an MI300"):
        registry.select("down")


def test_broken_explicit_backend_carries_the_load_error(registry) -> None:
    with pytest.raises(BackendUnavailableError, match=r"load-error.*ModuleNotFoundError"):
        registry.get("broken")


def test_nothing_available_lists_every_reason(plugins, make_backend) -> None:
    plugins.provides("fake_none", make_backend("a", available=False, reason="no npu"))
    plugins.dist("dist-none", a="fake_none", b="fake_b_missing")
    with pytest.raises(BackendUnavailableError, match=r"no backend is available.*a \(unavailable\): no npu.*b \("):
        plugins.registry().select()


def test_empty_registry() -> None:
    registry = BackendRegistry([])
    with pytest.raises(BackendUnavailableError, match="no backend is installed"):
        registry.select()
    with pytest.raises(BackendNotFoundError, match="no backends are known"):
        registry.get("x")


def test_registry_from_records(make_backend) -> None:
    cls = make_backend("handmade")
    registry = BackendRegistry([BackendRecord("handmade", BackendStatus.LOADED, backend_cls=cls)])
    assert registry.select() is cls and registry.names() == ["handmade"]
