"""graph_mode resolution and refusals, and the compiled-step cache's validation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from paged_core.api import (
    BackendCapabilities,
    CompiledStrategy,
    ConfigError,
    DeviceGraphStrategy,
    EagerStrategy,
    GraphCaptureStrategy,
    GraphSupport,
    UnsupportedConfigError,
)
from paged_core.contract.capabilities import AttentionSpec
from paged_core.engine_config import EngineConfig
from paged_core.reference.backend import ReferenceBackend
from paged_core.runner.compile_cache import MANIFEST, CompileCache
from paged_core.runner.executors import device_graph_refusal, resolve_graph_mode
from paged_core.runner.forward import TransformersForward
from paged_core.runner.fused import FusedDecoder


def test_unknown_graph_mode_is_refused_with_the_modes() -> None:
    with pytest.raises(ConfigError, match="graph_mode must be one of auto, eager, compiled, device; got 'fast'"):
        resolve_graph_mode("fast", ReferenceBackend())
    with pytest.raises(ConfigError, match="graph_mode must be one of"):
        EngineConfig.of(graph_mode="fast")
    with pytest.raises(ConfigError, match="model_impl must be one of auto, fused, transformers"):
        EngineConfig.of(model_impl="vllm")
    with pytest.raises(ConfigError, match="capture_sizes"):
        EngineConfig.of(capture_sizes=(0, 8))


def test_device_mode_is_refused_where_nothing_can_capture() -> None:
    backend = ReferenceBackend()
    assert "graph_support=never" in (device_graph_refusal(backend) or "")
    with pytest.raises(
        UnsupportedConfigError,
        match="device' refused: backend 'reference' declares graph_support="
        "never; modes that work here: eager, compiled",
    ):
        resolve_graph_mode("device", backend)
    assert resolve_graph_mode("auto", backend) == "eager"
    assert resolve_graph_mode("compiled", backend) == "compiled"


def _capturing(strategy: object, device: str = "cpu") -> ReferenceBackend:
    """The reference backend declaring uniform-decode capture, with ``strategy`` as its ``graph_strategy()``."""

    class Capturing(ReferenceBackend):
        name = "capturing"

        @classmethod
        def capabilities(cls) -> BackendCapabilities:
            return dataclasses.replace(ReferenceBackend.capabilities(), graph_support=GraphSupport.UNIFORM_DECODE)

        def graph_strategy(self) -> GraphCaptureStrategy:
            return strategy() if callable(strategy) else strategy  # type: ignore[return-value]

    backend = Capturing()
    backend.device = torch.device(device)
    return backend


def test_device_mode_takes_the_backends_strategy_or_says_why_not() -> None:
    # A vendor's own strategy (here a compiling one) runs wherever the backend runs, a CPU included.
    assert device_graph_refusal(_capturing(CompiledStrategy)) is None
    assert resolve_graph_mode("device", _capturing(CompiledStrategy)) == "device"
    assert resolve_graph_mode("auto", _capturing(CompiledStrategy)) == "eager"  # no device graphs on a CPU
    # The built-in device graphs need a device with a graph API.
    assert "has no graph API" in (device_graph_refusal(_capturing(lambda: DeviceGraphStrategy())) or "")
    assert device_graph_refusal(_capturing(EagerStrategy)) == (
        "backend 'capturing' returns EagerStrategy on cpu: nothing to capture"
    )
    with pytest.raises(
        UnsupportedConfigError, match="graph_strategy\\(\\) returned NoneType, not a GraphCaptureStrategy"
    ):
        resolve_graph_mode("device", _capturing(None))
    assert resolve_graph_mode("auto", _capturing(None)) == "eager"


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """activate() points torch's caches at the folder; undo that after each test."""
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _cache(tmp_path: Path, **fields: object) -> CompileCache:
    return CompileCache({"model": "m", "dtype": "float32", **fields}, tmp_path)


def test_sealed_cache_is_reused(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    assert not cache.validate()
    cache.activate()
    (cache.folder / "inductor").mkdir(exist_ok=True)
    (cache.folder / "inductor" / "graph.bin").write_bytes(b"compiled")
    cache.seal()
    again = _cache(tmp_path)
    again.activate()
    assert again.hit and (again.folder / "inductor" / "graph.bin").exists()


@pytest.mark.parametrize("damage", ["manifest", "file", "fields"])
def test_corrupt_or_foreign_cache_is_wiped_not_loaded(tmp_path: Path, damage: str) -> None:
    cache = _cache(tmp_path)
    cache.activate()
    artifact = cache.folder / "artifact.bin"
    artifact.write_bytes(b"good")
    cache.seal()
    if damage == "manifest":
        (cache.folder / MANIFEST).write_text("{not json")
    elif damage == "file":
        artifact.write_bytes(b"evil")
    else:
        data = json.loads((cache.folder / MANIFEST).read_text())
        data["fields"]["dtype"] = "bfloat16"  # a manifest that lies about what was compiled
        (cache.folder / MANIFEST).write_text(json.dumps(data))
    again = _cache(tmp_path)
    again.activate()
    assert not again.hit and not artifact.exists()


def test_a_different_configuration_gets_its_own_folder(tmp_path: Path) -> None:
    assert _cache(tmp_path).folder != _cache(tmp_path, dtype="bfloat16").folder
    assert _cache(tmp_path).folder != _cache(tmp_path, torch="9.9").folder


def test_piecewise_auto_is_on_where_whole_step_graphs_leave_steps_eager() -> None:
    from paged_core.runner.graph_modes import resolve_piecewise
    from paged_core.runner.piece_graphs import piece_refusal

    fused = object.__new__(FusedDecoder)  # only its type and specs are read
    fused.specs = [AttentionSpec(num_heads=2, num_kv_heads=1, head_size=8)] * 2
    assert piece_refusal(fused) is None
    uniform = _capturing(DeviceGraphStrategy())
    assert resolve_piecewise(None, "device", uniform, fused)  # device graphs of uniform decode: pieces take the rest
    assert not resolve_piecewise(None, "device", _capturing(CompiledStrategy()), fused)  # a vendor's: asked for
    assert resolve_piecewise(True, "device", _capturing(CompiledStrategy()), fused)
    assert not resolve_piecewise(False, "device", uniform, fused)
    assert resolve_piecewise(None, "compiled", ReferenceBackend(), fused)  # attention untraceable: pieces
    assert not resolve_piecewise(None, "compiled", uniform, fused)  # traceable: the whole step compiles
    assert not resolve_piecewise(None, "eager", ReferenceBackend(), fused)
    with pytest.raises(UnsupportedConfigError, match="piecewise capture needs graph_mode compiled or device"):
        resolve_piecewise(True, "eager", ReferenceBackend(), fused)
    transformers_path = TransformersForward(None, ReferenceBackend(), [])
    assert not resolve_piecewise(None, "device", uniform, transformers_path)
    with pytest.raises(UnsupportedConfigError, match="needs the fused decoder, not the transformers path"):
        resolve_piecewise(True, "device", uniform, transformers_path)
    fused.specs = [AttentionSpec(num_heads=2, num_kv_heads=1, head_size=8), AttentionSpec(4, 1, 8)]
    assert "same shape" in (piece_refusal(fused) or "")
