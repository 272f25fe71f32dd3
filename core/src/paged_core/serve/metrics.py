"""Prometheus metrics of one server: engine gauges from the latest snapshot, plus request counters and latencies.

Each server owns its own :class:`CollectorRegistry`, so several apps in one
process (tests) never collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from paged_core.engine_core.messages import (
    GRAMMAR_COMPILE_BUCKETS,
    GRAMMAR_MASK_BUCKETS,
    GrammarStats,
    SchedulerStats,
)
from paged_core.frontend.outputs import RequestOutput
from paged_core.speculative.proposer import SpecStats

# Latency buckets in seconds, from fast CPU decode steps to minute-long requests.
_TTFT = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_E2E = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


_GAUGES = (
    ("paged_kv_cache_usage_ratio", "Fraction of usable KV blocks in use (0-1).", "kv_usage"),
    ("paged_kv_cache_free_blocks", "KV blocks with no reference.", "num_free_blocks"),
    ("paged_kv_cache_blocks", "KV blocks that can hold tokens.", "num_usable_blocks"),
    ("paged_requests_running", "Requests being scheduled.", "num_running"),
    ("paged_requests_waiting", "Requests waiting for KV blocks or budget.", "num_waiting"),
    (
        "paged_batch_invariant",
        "1 when the running configuration is batch-invariant (a request's tokens do not "
        "depend on what it is batched with), else 0; the start-up log names each part that is not.",
        "batch_invariant",
    ),
)
_COUNTERS = (
    ("paged_preemptions", "Requests preempted to free KV blocks.", "num_preemptions"),
    ("paged_prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache.", "prefix_queries"),
    ("paged_prefix_cache_hits_tokens", "Prompt tokens found in the prefix cache.", "prefix_hits"),
    ("paged_engine_steps", "Engine steps run.", "steps"),
    ("paged_eager_steps", "Steps run eagerly (in a graph mode: fallbacks).", "eager_steps"),
    ("paged_spec_decode_verify_rows", "Speculative decoding: sequence steps that verified drafts.", "spec_verify_rows"),
    ("paged_spec_decode_draft_tokens", "Speculative decoding: draft tokens verified.", "spec_draft_tokens"),
    ("paged_spec_decode_accepted_tokens", "Speculative decoding: draft tokens the model kept.", "spec_accepted_tokens"),
)


class _EngineCollector(Collector):
    """Reports the engine snapshot at scrape time (the scrape never touches the engine itself).

    With one core the series carry no engine label. With several (data parallel, ``read_cores`` returns
    their :class:`~paged_core.clients.dp_client.CoreStatus`) every engine series has one sample per core,
    labelled ``engine="<index>"`` (sum them for the server), gauges for live cores only (a dead core holds
    nothing) and counters for all, plus ``paged_engine_up`` and the router's ``paged_dp_routed_requests``.
    """

    def __init__(self, read: Callable[[], SchedulerStats], read_cores: Callable[[], list[Any] | None] | None = None):
        self.read = read
        self.read_cores = read_cores

    def collect(self) -> Iterator[Metric]:
        cores = self.read_cores() if self.read_cores is not None else None
        if cores is None:
            yield from _engine_families([], [((), self.read(), True)])
            return
        yield from _engine_families(["engine"], [((str(c.index),), c.stats, c.alive) for c in cores])
        up = GaugeMetricFamily(
            "paged_engine_up", "1 while a data-parallel engine core serves, 0 once it died.", labels=["engine"]
        )
        routed = CounterMetricFamily(
            "paged_dp_routed_requests",
            "Requests the router placed on a core, by rule (affinity: a remembered prefix; balance: least loaded).",
            labels=["engine", "route"],
        )
        for c in cores:
            up.add_metric([str(c.index)], 1 if c.alive else 0)
            for route, count in sorted(c.routed.items()):
                routed.add_metric([str(c.index), route], count)
        yield up
        yield routed


def _engine_families(labels: list[str], rows: list[tuple[tuple[str, ...], SchedulerStats, bool]]) -> Iterator[Metric]:
    """The engine series, one sample per ``(label values, stats, alive)`` row."""
    for name, doc, attr in _GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=labels)
        for values, s, alive in rows:
            if alive:
                gauge.add_metric(list(values), float(getattr(s, attr)))
        yield gauge
    ratio = GaugeMetricFamily(
        "paged_prefix_cache_hit_ratio", "Prompt tokens found in the prefix cache / looked up.", labels=labels
    )
    for values, s, _ in rows:
        ratio.add_metric(list(values), s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0)
    yield ratio
    accept = GaugeMetricFamily(
        "paged_spec_decode_acceptance_ratio", "Draft tokens kept / verified (0 before any).", labels=labels
    )
    length = GaugeMetricFamily(
        "paged_spec_decode_mean_accepted_length",
        "Tokens produced per verifying sequence step: kept drafts plus the model's own (1 before any).",
        labels=labels,
    )
    for values, s, _ in rows:
        spec = SpecStats(s.spec_verify_rows, s.spec_draft_tokens, s.spec_accepted_tokens)
        accept.add_metric(list(values), spec.acceptance_rate)
        length.add_metric(list(values), spec.mean_accepted_length)
    yield accept
    yield length
    for name, doc, attr in _COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=labels)
        for values, s, _ in rows:
            counter.add_metric(list(values), getattr(s, attr))
        yield counter
    replays = CounterMetricFamily(
        "paged_graph_replays", "Steps run as a compiled or captured graph.", labels=[*labels, "graph_mode"]
    )
    pieces = CounterMetricFamily(
        "paged_graph_piece_replays",
        "Of the graph replays, steps run as captured or compiled pieces (piecewise).",
        labels=[*labels, "graph_mode"],
    )
    fallbacks = CounterMetricFamily(
        "paged_graph_fallbacks", "Eager fallbacks of a graph mode, by reason.", labels=[*labels, "reason"]
    )
    for values, s, _ in rows:
        replays.add_metric([*values, s.graph_mode], s.graph_replays)
        pieces.add_metric([*values, s.graph_mode], s.graph_piece_replays)
        for reason, count in sorted(s.graph_fallbacks.items()):
            fallbacks.add_metric([*values, reason], count)
    yield replays
    yield pieces
    yield fallbacks
    yield from _grammar_families(labels, [(values, s.grammar) for values, s, _ in rows])


def _grammar_families(labels: list[str], rows: list[tuple[tuple[str, ...], GrammarStats]]) -> Iterator[Metric]:
    """Structured outputs: constrained requests, failed compiles, compile time, mask time per step, rows masked."""
    requests = CounterMetricFamily(
        "paged_structured_requests", "Requests that came with structured_outputs (a grammar to compile).", labels=labels
    )
    failures = CounterMetricFamily(
        "paged_structured_compile_failures",
        "Grammar compiles that failed their request, by reason (error: refused by the grammar engine; timeout).",
        labels=[*labels, "reason"],
    )
    compiles = HistogramMetricFamily(
        "paged_structured_compile_seconds", "Seconds per grammar compile (on the compile pool).", labels=labels
    )
    masks = HistogramMetricFamily(
        "paged_structured_mask_seconds",
        "Seconds per engine step with constrained rows spent filling and applying their token masks.",
        labels=labels,
    )
    mask_rows = CounterMetricFamily(
        "paged_structured_mask_rows", "Constrained logits rows masked (sum over steps).", labels=labels
    )
    for values, g in rows:
        requests.add_metric(list(values), g.requests)
        failures.add_metric([*values, "error"], g.compile_errors)
        failures.add_metric([*values, "timeout"], g.compile_timeouts)
        compiles.add_metric(list(values), _buckets(GRAMMAR_COMPILE_BUCKETS, g.compile_buckets), g.compile_seconds)
        masks.add_metric(list(values), _buckets(GRAMMAR_MASK_BUCKETS, g.mask_buckets), g.mask_seconds)
        mask_rows.add_metric(list(values), g.mask_rows)
    yield from (requests, failures, compiles, masks, mask_rows)


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus' cumulative ``(le, count)`` pairs from per-bucket counts (all zero when ``counts`` is empty)."""
    counts = counts or [0] * (len(bounds) + 1)
    out, total = [], 0
    for le, count in zip([*(repr(b) for b in bounds), "+Inf"], counts, strict=True):
        total += count
        out.append((le, float(total)))
    return out


@dataclass
class _Tracked:
    last_token_time: float | None = None
    counted_prompt: bool = False


@dataclass
class ServerMetrics:
    """Counters and histograms fed from engine outputs, and the engine gauges."""

    read_stats: Callable[[], SchedulerStats]
    read_cores: Callable[[], list[Any] | None] | None = None
    """Each core's status when several serve (data parallel); see :class:`_EngineCollector`."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.prompt_tokens = Counter("paged_prompt_tokens", "Prompt tokens of requests that started.", registry=r)
        self.generation_tokens = Counter("paged_generation_tokens", "Tokens generated.", registry=r)
        self.finished = Counter(
            "paged_requests_finished", "Completions finished, by reason.", ["finish_reason"], registry=r
        )
        self.aborted = Counter("paged_requests_aborted", "Requests aborted (client gone or error).", registry=r)
        self.ttft = Histogram("paged_time_to_first_token_seconds", "Arrival to first token.", buckets=_TTFT, registry=r)
        self.itl = Histogram(
            "paged_inter_token_latency_seconds", "Gap between a request's successive steps.", buckets=_ITL, registry=r
        )
        self.e2e = Histogram("paged_e2e_request_latency_seconds", "Arrival to completion.", buckets=_E2E, registry=r)
        self.in_flight = Gauge(
            "paged_requests_in_flight", "Engine sequences admitted and not yet done (event loop).", registry=r
        )
        self.in_flight_limit = Gauge(
            "paged_requests_in_flight_limit", "Admission bound: max_num_seqs + max_queued_requests.", registry=r
        )
        self.refused = Counter(
            "paged_requests_refused", "Generation requests refused by admission, by reason.", ["reason"], registry=r
        )
        self.refused.labels(reason="queue_full")  # exported at 0 from the start, so rates work before the first refusal
        r.register(_EngineCollector(self.read_stats, self.read_cores))
        self._live: dict[str, _Tracked] = {}

    def observe(self, outputs: list[RequestOutput], now: float) -> None:
        """Account one step's outputs (called on the event loop with the step's end time)."""
        for out in outputs:
            state = self._live.setdefault(out.request_id, _Tracked())
            new = sum(len(c.new_token_ids) for c in out.outputs)
            if new:
                self.generation_tokens.inc(new)
                if state.last_token_time is None:
                    ttft = out.metrics.time_to_first_token
                    self.ttft.observe(ttft if ttft is not None else now - out.metrics.arrival_time)
                else:
                    self.itl.observe(now - state.last_token_time)
                state.last_token_time = now
            if not state.counted_prompt:
                self.prompt_tokens.inc(len(out.prompt_token_ids))
                state.counted_prompt = True
            if out.finished:
                del self._live[out.request_id]
                latency = out.metrics.latency
                self.e2e.observe(latency if latency is not None else now - out.metrics.arrival_time)
                for c in out.outputs:
                    self.finished.labels(finish_reason=c.finish_reason or "unknown").inc()

    def on_abort(self, request_id: str) -> None:
        """Count an abort and forget the request's timing state."""
        self._live.pop(request_id, None)
        self.aborted.inc()

    def forget(self, request_id: str) -> None:
        """Drop a request's timing state without counting it (it failed rather than being aborted)."""
        self._live.pop(request_id, None)

    def set_in_flight(self, value: int) -> None:
        """Admission's count of sequences in flight changed."""
        self.in_flight.set(value)

    def count_refusal(self, reason: str) -> None:
        """A generation request was refused by admission (``queue_full``)."""
        self.refused.labels(reason=reason).inc()

    def render(self) -> bytes:
        """The exposition text for ``GET /metrics``."""
        return generate_latest(self.registry)
