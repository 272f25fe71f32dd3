"""kv-util: the real scheduler's occupancy against the reservation baseline on one budget."""

from __future__ import annotations

import pytest

from paged_bench.kv_util import KVUtilConfig, run_kv_util, simulate_paged
from paged_bench.trace import MAX_POINTS, UtilizationTrace
from paged_bench.workloads import BenchRequest, kv_util


def test_one_request_step_by_step() -> None:
    # Block 16: the prompt fills block 1; the first decode write needs block 2.
    cfg = KVUtilConfig(kv_tokens=64, block_size=16, max_len=64, max_num_batched_tokens=64, max_num_seqs=8)
    trace = simulate_paged([BenchRequest(list(range(100, 116)), 4)], cfg)
    assert trace.used == [16, 17, 18, 19]
    assert trace.allocated == [16, 32, 32, 32]
    assert trace.utilization == pytest.approx(70 / 112)


def test_paged_beats_reservation_on_sharegpt_lengths() -> None:
    reqs = kv_util(150, max_len=2048)
    cfg = KVUtilConfig(kv_tokens=16384, block_size=16, max_len=2048, max_num_batched_tokens=1024, max_num_seqs=128)
    paged, reserved, extra = run_kv_util(reqs, cfg)
    assert extra == {}  # a full-attention model has no second accounting
    assert reserved.peak_concurrent == 16384 // 2048
    assert paged.peak_concurrent >= 3 * reserved.peak_concurrent
    assert paged.utilization > 0.9 > 0.5 > reserved.utilization
    # Both ran every request to completion: the paged run wrote each request's tokens at least once.
    assert paged.steps > 0 and reserved.steps > 0


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="block_size"):
        KVUtilConfig(block_size=0)
    with pytest.raises(ValueError, match="less than one block"):
        KVUtilConfig(kv_tokens=8, block_size=16)
    with pytest.raises(ValueError, match="max_len=4096 exceeds"):
        KVUtilConfig(kv_tokens=2048, max_len=4096)


def test_trace_figures_and_thinning() -> None:
    t = UtilizationTrace("x", num_slots=100)
    for i in range(1, 1201):
        t.sample(allocated=50, used=25, running=i % 7)
    assert t.utilization == 0.5 and t.budget_occupancy == 0.25 and t.peak_concurrent == 6
    d = t.to_dict()
    assert len(d["series"]["step"]) <= MAX_POINTS and d["series_stride"] == 3
    with pytest.raises(ValueError, match="only 10 are allocated"):
        t.sample(allocated=10, used=11, running=1)


def test_sliding_model_holds_only_its_windows() -> None:
    # One request, every layer sliding over 16 tokens: after its 40-token prompt it never holds more than
    # the window's blocks (3 of 16), while full accounting keeps every block of its 340 tokens.
    req = [BenchRequest(list(range(100, 140)), 300)]
    cfg = KVUtilConfig(kv_tokens=1024, block_size=16, max_len=512, max_num_batched_tokens=64, layer_windows=(16, 16))
    paged, _, extra = run_kv_util(req, cfg)
    full = extra["full_accounting"]
    assert max(paged.allocated) == 3 * 16
    assert max(full.allocated) == -(-340 // 16) * 16
    # Each held slot that a query can still read counts as used: the window, never more than held.
    assert all(u <= a for u, a in zip(paged.used, paged.allocated, strict=True))


def test_hybrid_model_holds_more_requests_than_full_accounting() -> None:
    reqs = kv_util(150, max_len=2048)
    windows = (256, 256, 256, 256, 256, None)  # Gemma 3's pattern: five sliding layers to one full
    cfg = KVUtilConfig(
        kv_tokens=8192, max_len=2048, max_num_batched_tokens=1024, max_num_seqs=128, layer_windows=windows
    )
    paged, _, extra = run_kv_util(reqs, cfg)
    full = extra["full_accounting"]
    assert paged.peak_concurrent > full.peak_concurrent
    assert paged.mean_concurrent > 1.3 * full.mean_concurrent
    assert paged.steps < full.steps


def test_layer_windows_are_checked() -> None:
    from paged_bench.cli import layer_windows

    assert layer_windows("16,full") == (16, None)
    with pytest.raises(ValueError, match="'x' is neither a window"):
        layer_windows("16,x")
    with pytest.raises(ValueError, match="layer windows must be ints"):
        KVUtilConfig(layer_windows=(0,))
