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
    paged, reserved = run_kv_util(reqs, cfg)
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
