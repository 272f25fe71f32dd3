"""Name clashes between sources: both unusable, unless one is a core built-in."""

from __future__ import annotations

import pytest

from paged_core.api import BackendUnavailableError
from paged_core.registry import BackendStatus


def test_same_name_from_two_distributions_marks_both(plugins, make_backend) -> None:
    plugins.provides("fake_dup_a", make_backend("fast"))
    plugins.provides("fake_dup_b", make_backend("fast"))
    plugins.provides("fake_other", make_backend("other"))
    plugins.dist("paged-backend-a", "1.0", fast_a="fake_dup_a")
    plugins.dist("paged-backend-b", "2.0", fast_b="fake_dup_b", other="fake_other")
    registry = plugins.registry()
    fast = [r for r in registry.records() if r.name == "fast"]
    assert [r.status for r in fast] == [BackendStatus.DUPLICATE] * 2
    for rec in fast:
        assert "paged-backend-a 1.0" in rec.reason and "paged-backend-b 2.0" in rec.reason
        assert "PAGED_BACKENDS_DENY" in rec.reason
    with pytest.raises(BackendUnavailableError, match="duplicate"):
        registry.get("fast")
    assert registry.select().name == "other"


def test_denying_one_distribution_resolves_the_clash(plugins, make_backend, monkeypatch) -> None:
    plugins.provides("fake_dup_c", make_backend("fast"))
    plugins.dist("paged-backend-a", fast_a="fake_dup_c")
    plugins.dist("paged-backend-b", fast_b="fake_never_imported")
    monkeypatch.setenv("PAGED_BACKENDS_DENY", "paged-backend-b")
    registry = plugins.registry()
    assert registry.get("fast").name == "fast"
    disabled = [r for r in registry.records() if r.status is BackendStatus.DISABLED]
    assert [r.name for r in disabled] == ["fast_b"]


def test_builtin_wins_over_third_party(plugins, make_backend) -> None:
    builtin_cls = make_backend("reference")
    plugins.provides("fake_builtin", builtin_cls)
    plugins.provides("fake_impostor", make_backend("reference"))
    plugins.dist("paged-backend-evil", "0.1", reference="fake_impostor")
    registry = plugins.registry(builtins={"reference": "fake_builtin"})
    assert registry.get("reference") is builtin_cls
    [builtin] = [r for r in registry.records() if r.builtin]
    [third] = [r for r in registry.records() if not r.builtin]
    assert builtin.status is BackendStatus.LOADED
    assert third.status is BackendStatus.DUPLICATE
    assert "built-in" in third.reason and "paged-core" in third.reason


def test_same_class_reached_twice_is_one_backend(plugins, make_backend) -> None:
    cls = make_backend("shared")
    plugins.provides("fake_builtin2", cls)
    plugins.dist("paged-core-extra", shared="fake_builtin2")
    registry = plugins.registry(builtins={"shared": "fake_builtin2"})
    assert [(r.name, r.status, r.builtin) for r in registry.records()] == [("shared", BackendStatus.LOADED, True)]


def test_unavailable_duplicate_still_blocks(plugins, make_backend) -> None:
    plugins.provides("fake_dup_u1", make_backend("x", available=False, reason="nope"))
    plugins.provides("fake_dup_u2", make_backend("x"))
    plugins.dist("dist-u1", x1="fake_dup_u1")
    plugins.dist("dist-u2", x2="fake_dup_u2")
    registry = plugins.registry()
    assert {r.status for r in registry.records()} == {BackendStatus.DUPLICATE}
    with pytest.raises(BackendUnavailableError, match="dist-u1"):
        registry.select("x")
