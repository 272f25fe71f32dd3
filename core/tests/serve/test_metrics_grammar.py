"""`/metrics`' structured-output series: histograms from per-bucket counts, per core with data parallelism."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from paged_core.clients.dp_client import sum_stats
from paged_core.engine_core.messages import (
    GRAMMAR_COMPILE_BUCKETS,
    GRAMMAR_MASK_BUCKETS,
    CoreOutputs,
    GrammarStats,
    SchedulerStats,
)
from paged_core.serve.metrics import ServerMetrics


def _grammar(requests: int, compile_at: int, mask_at: int, steps: int) -> GrammarStats:
    """``requests`` compiles all in bucket ``compile_at``, ``steps`` masked steps in bucket ``mask_at``."""
    compiles = [0] * (len(GRAMMAR_COMPILE_BUCKETS) + 1)
    compiles[compile_at] = requests
    masks = [0] * (len(GRAMMAR_MASK_BUCKETS) + 1)
    masks[mask_at] = steps
    return GrammarStats(requests, 1, 2, compiles, 0.5 * requests, masks, 0.001 * steps, 3 * steps)


def _samples(metrics: ServerMetrics) -> dict[str, float]:
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name.startswith("paged_structured_")
    }


def test_one_core_reports_counters_and_cumulative_buckets() -> None:
    g = _grammar(requests=4, compile_at=2, mask_at=len(GRAMMAR_MASK_BUCKETS), steps=5)
    s = _samples(ServerMetrics(lambda: SchedulerStats(grammar=g)))
    assert s["paged_structured_requests_total[]"] == 4
    assert s["paged_structured_compile_failures_total[('reason', 'error')]"] == 1
    assert s["paged_structured_compile_failures_total[('reason', 'timeout')]"] == 2
    le = [repr(b) for b in GRAMMAR_COMPILE_BUCKETS]
    assert s[f"paged_structured_compile_seconds_bucket[('le', '{le[1]}')]"] == 0
    assert s[f"paged_structured_compile_seconds_bucket[('le', '{le[2]}')]"] == 4  # cumulative from its bucket on
    assert s[f"paged_structured_compile_seconds_bucket[('le', '{le[-1]}')]"] == 4
    assert s["paged_structured_compile_seconds_count[]"] == 4 and s["paged_structured_compile_seconds_sum[]"] == 2.0
    last = repr(GRAMMAR_MASK_BUCKETS[-1])
    assert s[f"paged_structured_mask_seconds_bucket[('le', '{last}')]"] == 0  # past the last bound: +Inf only
    assert s["paged_structured_mask_seconds_bucket[('le', '+Inf')]"] == 5
    assert s["paged_structured_mask_seconds_count[]"] == 5
    assert s["paged_structured_mask_rows_total[]"] == 15


def test_an_engine_without_constraints_exports_zeros() -> None:
    s = _samples(ServerMetrics(SchedulerStats))
    assert s["paged_structured_requests_total[]"] == 0
    assert s["paged_structured_compile_seconds_count[]"] == 0
    assert s["paged_structured_mask_seconds_bucket[('le', '+Inf')]"] == 0


def test_data_parallel_cores_are_labelled_and_summed() -> None:
    a = _grammar(requests=2, compile_at=0, mask_at=1, steps=3)
    b = _grammar(requests=5, compile_at=1, mask_at=1, steps=4)
    cores = [
        SimpleNamespace(index=i, stats=SchedulerStats(grammar=g), alive=True, routed={}) for i, g in enumerate((a, b))
    ]
    s = _samples(ServerMetrics(SchedulerStats, lambda: cores))
    assert s["paged_structured_requests_total[('engine', '0')]"] == 2
    assert s["paged_structured_requests_total[('engine', '1')]"] == 5
    assert s["paged_structured_mask_seconds_count[('engine', '1')]"] == 4
    total = sum_stats([], [SchedulerStats(grammar=a), SchedulerStats(grammar=b), SchedulerStats()]).grammar
    assert total.requests == 7 and total.mask_rows == 21 and total.compile_timeouts == 4
    assert total.compile_buckets[:2] == [2, 5] and total.mask_buckets[1] == 7


def test_the_stats_cross_the_process_boundary() -> None:
    g = _grammar(requests=3, compile_at=4, mask_at=2, steps=6)
    wire = msgspec.msgpack.encode(CoreOutputs([], SchedulerStats(grammar=g)))
    assert msgspec.msgpack.decode(wire, type=CoreOutputs).stats.grammar == g
