"""Meta-tests on the public surfaces: every export documented, the two audiences kept apart, every hook tested."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest

import paged_core
from paged_core import api
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.graph_strategy import GraphCaptureStrategy

SUITE = Path(__file__).resolve().parents[2] / "plugins" / "conformance" / "src" / "paged_conformance"

# Names that only users of the engine need; the vendor contract must not carry them.
USER_ONLY = {"LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"}
USER_ONLY |= {"EngineConfig", "ModelConfig", "CacheConfig", "SchedulerConfig", "GraphConfig", "ParallelConfig"}
USER_ONLY |= {"RequestRejectedError", "EngineDeadError", "SpeculativeConfig", "BeamSearchOutput", "BeamSequence"}


def _hooks(cls: type) -> list[str]:
    """Public methods (class methods included) defined on ``cls`` itself."""
    return [n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, classmethod))]


def _undocumented(module: ModuleType) -> list[str]:
    """Exported classes and functions of ``module`` that have no docstring."""
    return [
        name
        for name in module.__all__
        if (inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name)))
        and not inspect.getdoc(getattr(module, name))
    ]


@pytest.mark.parametrize("module", [api, paged_core], ids=["paged_core.api", "paged_core"])
def test_every_export_exists_and_is_documented(module: ModuleType) -> None:
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
    assert _undocumented(module) == []


def test_vendor_contract_holds_no_user_only_names() -> None:
    assert sorted(USER_ONLY & set(api.__all__)) == []


def test_package_exports_the_users_names() -> None:
    assert set(paged_core.__all__) == USER_ONLY | {"PagedError", "ConfigError", "__version__"}


def test_shared_errors_are_the_same_objects_on_both_surfaces() -> None:
    for name in set(api.__all__) & set(paged_core.__all__):
        assert getattr(paged_core, name) is getattr(api, name)


def test_every_backend_and_strategy_hook_is_documented() -> None:
    undocumented = [
        f"{cls.__name__}.{name}"
        for cls in (AttentionBackend, GraphCaptureStrategy)
        for name in _hooks(cls)
        if not inspect.getdoc(getattr(cls, name))
    ]
    assert undocumented == []


def test_every_backend_hook_is_exercised_by_the_conformance_suite() -> None:
    source = "\n".join(p.read_text() for p in SUITE.rglob("*.py"))
    untested = [name for name in _hooks(AttentionBackend) if f".{name}(" not in source]
    assert untested == [], f"backend hooks the conformance suite never calls: {untested}"
