"""Meta-tests on the public surfaces: every export documented, the two audiences kept apart, every hook tested."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest

import paged_core
from paged_core import api, testing
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.graph_strategy import GraphCaptureStrategy

SUITE = Path(__file__).resolve().parents[2] / "plugins" / "conformance" / "src" / "paged_conformance"

# Names that only users of the engine need; the vendor contract must not carry them.
USER_ONLY = {"LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"}
USER_ONLY |= {"EngineConfig", "ModelConfig", "CacheConfig", "SchedulerConfig", "GraphConfig", "ParallelConfig"}
USER_ONLY |= {"RequestRejectedError", "EngineDeadError", "SpeculativeConfig", "BeamSearchOutput", "BeamSequence"}
USER_ONLY |= {"LoRARequest"}

# The vendor contract, pinned: what a backend implements or calls. A name added here is a promise to every backend.
CONTRACT = {"AttentionBackend", "Availability", "BackendCapabilities", "AttentionSpec", "GraphSupport"}
CONTRACT |= {"AttentionMetadata", "build_attention_metadata"}
CONTRACT |= {"check_attention_inputs", "check_default_cache", "check_write_inputs"}
CONTRACT |= {"FusedOps", "PackedLinear", "linear_kind", "LINEAR_KINDS", "DENSE_LINEAR_KINDS", "head_rotation"}
CONTRACT |= {"QuantizedWeight", "WeightFormat", "LINEAR_FORMATS"}
CONTRACT |= {"Activation", "MoERouting", "PackedExperts", "route_experts", "check_moe_inputs", "check_experts_inputs"}
CONTRACT |= {"GraphCaptureStrategy", "StepFn", "EagerStrategy", "CompiledStrategy", "DeviceGraphStrategy"}
CONTRACT |= {"DeviceHooks", "TorchDeviceHooks", "default_device_hooks"}
CONTRACT |= {"PagedError", "ConfigError", "UnsupportedConfigError", "BackendUnavailableError", "BackendNotFoundError"}
CONTRACT |= {"WeightFormatError", "PLUGIN_API_VERSION", "SUPPORTED_PLUGIN_API_VERSIONS", "hookimpl"}
CONTRACT |= {"QUANTIZED_KV_DTYPES", "is_quantized_kv", "quantize_kv", "dequantize_kv"}

# What a backend's tests use beyond the contract: oracles, test data and the harness.
TESTING = {"ReferenceBackend", "ReferenceFusedOps", "dequantize", "reference_linear", "round_activations_q8"}
TESTING |= {"random_packed", "quantize_blocks", "GraphRunner", "StaticInput", "load_registry", "strategy_problem"}


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


@pytest.mark.parametrize("module", [api, testing, paged_core], ids=lambda m: m.__name__)
def test_every_export_exists_and_is_documented(module: ModuleType) -> None:
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
    assert _undocumented(module) == []


def test_vendor_contract_holds_no_user_only_names() -> None:
    assert sorted(USER_ONLY & set(api.__all__)) == []


def test_vendor_contract_is_exactly_the_pinned_names() -> None:
    assert sorted(set(api.__all__) - CONTRACT) == [], "new in paged_core.api: pin it in CONTRACT (a promise to vendors)"
    assert sorted(CONTRACT - set(api.__all__)) == [], "gone from paged_core.api: a break for every backend"
    assert len(api.__all__) == len(CONTRACT) == 46


def test_oracles_live_in_testing_not_in_the_contract() -> None:
    assert set(testing.__all__) == TESTING
    assert sorted(TESTING & set(api.__all__)) == []
    assert [name for name in TESTING if hasattr(api, name)] == []


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
