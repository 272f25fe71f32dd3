"""The reserve-max-length baseline: allocator bookkeeping and its step simulation, checked by hand."""

from __future__ import annotations

import pytest

from paged_bench.reservation import ReservationAllocator, simulate_reserved
from paged_bench.workloads import BenchRequest


def req(prompt: int, output: int) -> BenchRequest:
    return BenchRequest(list(range(100, 100 + prompt)), output)


def test_allocator_holds_whole_reservations_only() -> None:
    a = ReservationAllocator(num_slots=100, reserve=30)
    assert a.max_concurrent == 3
    for i in range(3):
        a.allocate(i)
    assert a.allocated_slots == 90 and not a.can_allocate()
    with pytest.raises(ValueError, match="no room for request 3"):
        a.allocate(3)
    a.free(1)
    assert a.can_allocate()
    a.allocate(3)
    assert a.holders == {0, 2, 3}


def test_allocator_rejects_misuse() -> None:
    a = ReservationAllocator(10, 5)
    a.allocate(0)
    with pytest.raises(ValueError, match="already holds"):
        a.allocate(0)
    with pytest.raises(ValueError, match="holds no reservation"):
        a.free(1)
    with pytest.raises(ValueError, match="exceeds the whole budget"):
        ReservationAllocator(10, 11)
    with pytest.raises(ValueError, match="reserve must be an int"):
        ReservationAllocator(10, 0)


def test_one_request_step_by_step() -> None:
    # Prompt 16 in one step, then 3 decode steps write tokens 17..19 (the 4th output is only sampled).
    trace = simulate_reserved([req(16, 4)], num_slots=64, max_len=64, max_num_batched_tokens=64, max_num_seqs=8)
    assert trace.used == [16, 17, 18, 19]
    assert trace.allocated == [64] * 4
    assert trace.utilization == pytest.approx(70 / 256)


def test_concurrency_is_capped_by_whole_reservations() -> None:
    reqs = [req(8, 4) for _ in range(10)]
    trace = simulate_reserved(reqs, num_slots=100, max_len=32, max_num_batched_tokens=512, max_num_seqs=64)
    assert trace.peak_concurrent == 3  # 100 // 32
    assert max(trace.allocated) == 96
    assert all(u <= a for u, a in zip(trace.used, trace.allocated, strict=True))
    # Waves of 3, 3, 3, 1, each 4 steps (prefill + 3 decodes): 16 steps.
    assert trace.steps == 16


def test_chunked_prompts_follow_the_token_budget() -> None:
    trace = simulate_reserved([req(40, 2)], num_slots=64, max_len=64, max_num_batched_tokens=16, max_num_seqs=8)
    assert trace.used == [16, 32, 40, 41]


def test_a_request_longer_than_max_len_is_refused() -> None:
    with pytest.raises(ValueError, match="request 1 needs 70 tokens"):
        simulate_reserved([req(8, 2), req(60, 10)], 128, 64, 64, 8)
