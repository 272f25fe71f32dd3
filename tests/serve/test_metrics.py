"""``/metrics`` parses with prometheus_client's text parser, and its counters move as requests complete."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .serve_helpers import MODEL_NAME, MODES, ServerThread, metric_values, serve

GAUGES = (
    "paged_kv_cache_usage_ratio",
    "paged_kv_cache_free_blocks",
    "paged_kv_cache_blocks",
    "paged_requests_running",
    "paged_requests_waiting",
    "paged_batch_invariant",
)
COUNTERS = (
    "paged_preemptions_total",
    "paged_prefix_cache_queries_tokens_total",
    "paged_prefix_cache_hits_tokens_total",
    "paged_prompt_tokens_total",
    "paged_generation_tokens_total",
    "paged_requests_aborted_total",
)
HISTOGRAMS = (
    "paged_time_to_first_token_seconds",
    "paged_inter_token_latency_seconds",
    "paged_e2e_request_latency_seconds",
)


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest, loaded: Any) -> Iterator[ServerThread]:
    with serve(loaded, mode=request.param) as s:
        yield s


def _metrics(server: ServerThread) -> dict[str, float]:
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return metric_values(r.text)


def test_every_metric_is_exposed(server: ServerThread) -> None:
    m = _metrics(server)
    for name in GAUGES + COUNTERS:
        assert name in m, name
    for name in HISTOGRAMS:
        assert f"{name}_count" in m and f"{name}_sum" in m and f"{name}_bucket{{le=+Inf}}" in m, name
    assert m["paged_kv_cache_blocks"] > 0 and m["paged_kv_cache_usage_ratio"] == 0.0
    assert m["paged_batch_invariant"] in (0.0, 1.0)


def test_counters_move_as_requests_complete(server: ServerThread) -> None:
    before = _metrics(server)
    prompt = "Metrics should count every one of these prompt tokens. " * 4
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 5, "n": 2, "ignore_eos": True}
    for _ in range(2):  # the second run hits the prefix cache
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    after = _metrics(server)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert delta("paged_prompt_tokens_total") == 2 * usage["prompt_tokens"]
    assert delta("paged_generation_tokens_total") == 2 * 2 * 5
    assert delta("paged_requests_finished_total{finish_reason=length}") == 2 * 2
    assert delta("paged_time_to_first_token_seconds_count") == 2
    assert delta("paged_e2e_request_latency_seconds_count") == 2
    assert delta("paged_inter_token_latency_seconds_count") >= 2 * 4
    assert delta("paged_e2e_request_latency_seconds_sum") > 0
    assert delta("paged_prefix_cache_queries_tokens_total") >= 2 * usage["prompt_tokens"]
    assert delta("paged_prefix_cache_hits_tokens_total") >= 16
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 16
    assert delta("paged_engine_steps_total") >= 5
    # The test server steps eagerly, so every step is counted as eager and none as a replay.
    assert delta("paged_eager_steps_total") == delta("paged_engine_steps_total")
    assert delta("paged_graph_replays_total{graph_mode=eager}") == 0


def test_structured_series_move_with_a_constrained_request(server: ServerThread) -> None:
    before = _metrics(server)
    for name in ("paged_structured_compile_seconds", "paged_structured_mask_seconds"):
        assert f"{name}_bucket{{le=+Inf}}" in before and f"{name}_sum" in before, name
    plain = {"model": MODEL_NAME, "prompt": "An answer:", "max_tokens": 3}
    assert httpx.post(f"{server.url}/v1/completions", json=plain, timeout=60).status_code == 200
    middle = _metrics(server)
    body = {**plain, "max_tokens": 20, "structured_outputs": {"regex": "(yes|no)-[0-9]{3}"}}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    tokens = r.json()["usage"]["completion_tokens"]
    after = _metrics(server)

    def delta(name: str, start: dict[str, float] = middle) -> float:
        return after[name] - start.get(name, 0.0)

    assert middle["paged_structured_requests_total"] == before["paged_structured_requests_total"]  # plain: not counted
    assert middle["paged_structured_mask_seconds_count"] == before["paged_structured_mask_seconds_count"]
    assert delta("paged_structured_requests_total") == 1
    assert delta("paged_structured_compile_seconds_count") == 1
    assert delta("paged_structured_compile_seconds_bucket{le=+Inf}") == 1
    assert delta("paged_structured_compile_seconds_sum") > 0
    # One masked step per sampled token (no speculation here), each of one row.
    assert delta("paged_structured_mask_seconds_count") == tokens
    assert delta("paged_structured_mask_rows_total") == tokens
    assert delta("paged_structured_mask_seconds_sum") > 0
    assert delta("paged_structured_compile_failures_total{reason=error}") == 0
    assert delta("paged_structured_compile_failures_total{reason=timeout}") == 0
