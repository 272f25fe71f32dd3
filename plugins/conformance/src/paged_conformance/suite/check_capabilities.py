"""The declared envelope refuses what it does not declare, and the backend's hooks agree with it."""

from __future__ import annotations

import pytest
import torch

from paged_conformance.grid import DTYPES, GQA_RATIOS, HEAD_SIZES, NUM_KV_HEADS, base_config, declared_dtypes
from paged_conformance.session import Conformance
from paged_core.api import AttentionSpec, DeviceHooks, GraphCaptureStrategy, GraphSupport, UnsupportedConfigError
from paged_core.testing import strategy_problem

AXES = ("dtype", "head_size", "block_size", "gqa", "sliding_window", "soft_cap")


def _undeclared(conformance: Conformance, axis: str) -> tuple[AttentionSpec, torch.dtype, int] | None:
    """A config that differs from a declared one only on ``axis``, or None if that axis is fully declared."""
    caps = conformance.caps
    base = base_config(caps)
    if base is None:
        return None
    head, gqa = base
    dtype, block = declared_dtypes(caps)[0], caps.block_sizes[0]
    spec = AttentionSpec(NUM_KV_HEADS * gqa, NUM_KV_HEADS, head)
    if axis == "dtype":
        other = [d for d in (*DTYPES, torch.float64) if d not in caps.dtypes]
        return (spec, other[0], block) if other else None
    if axis == "head_size":
        known = caps.head_sizes
        other_h = [h for h in (*HEAD_SIZES, 96, 112, 192, 48) if known is not None and h not in known]
        return (AttentionSpec(spec.num_heads, NUM_KV_HEADS, other_h[0]), dtype, block) if other_h else None
    if axis == "block_size":
        return spec, dtype, next(b for b in (3, 5, 7, 12, 24, 48, 96, 768) if b not in caps.block_sizes)
    if axis == "gqa":
        other_g = [g for g in (*GQA_RATIOS, 2, 16) if caps.gqa_ratios is not None and g not in caps.gqa_ratios]
        return (AttentionSpec(NUM_KV_HEADS * other_g[0], NUM_KV_HEADS, head), dtype, block) if other_g else None
    if axis == "sliding_window":
        windowed = AttentionSpec(spec.num_heads, NUM_KV_HEADS, head, sliding_window=8)
        return None if caps.sliding_window else (windowed, dtype, block)
    if not caps.logits_soft_cap:
        return AttentionSpec(spec.num_heads, NUM_KV_HEADS, head, logits_soft_cap=30.0), dtype, block
    return None


@pytest.mark.paged_capability("capability_check")
@pytest.mark.parametrize("axis", AXES)
def test_refuses_undeclared(conformance: Conformance, axis: str) -> None:
    """``capabilities().check`` raises UnsupportedConfigError for a config outside the envelope on ``axis``."""
    config = _undeclared(conformance, axis)
    if config is None:
        pytest.skip(f"N/A: every {axis} the suite knows is declared")
    spec, dtype, block = config
    with pytest.raises(UnsupportedConfigError):
        conformance.caps.check(spec, dtype, block)


@pytest.mark.paged_capability("graph")
def test_graph_strategy_hook(conformance: Conformance) -> None:
    """``graph_strategy()`` returns a fresh :class:`GraphCaptureStrategy` holding no capture.

    A backend declaring capture must return a strategy that can serve it: not ``None``, and not
    :class:`EagerStrategy` on a device with device graphs (the engine would capture nothing).
    """
    backend = conformance.backend()
    problem = strategy_problem(backend)
    assert problem is None, problem
    strategy = backend.graph_strategy()
    assert isinstance(strategy, GraphCaptureStrategy), f"graph_strategy() returned {type(strategy).__name__}"
    if conformance.caps.graph_support == GraphSupport.NEVER:
        pytest.skip("N/A: graph capture not declared")
    assert strategy.has("paged-conformance-probe") is False, "a fresh strategy claims to hold a capture"


@pytest.mark.paged_capability("capability_check")
def test_device_hooks(conformance: Conformance) -> None:
    """``device_hooks()`` describes the backend's device: memory it can tell is consistent, and every call works."""
    backend = conformance.backend()
    hooks = backend.device_hooks()
    assert isinstance(hooks, DeviceHooks), f"device_hooks() returned {type(hooks).__name__}"
    assert hooks.device.type == backend.device.type, f"hooks for {hooks.device}, backend on {backend.device}"
    memory = hooks.memory()
    if memory is not None:
        free, total = memory
        assert 0 <= free <= total and total > 0, f"memory() gave free={free}, total={total}"
    hooks.synchronize()
    hooks.reset_peak_memory()
    peak = hooks.peak_memory()
    assert peak is None or peak >= 0, f"peak_memory() gave {peak}"
    hooks.empty_cache()
