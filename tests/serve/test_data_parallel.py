"""Data parallel with real processes: prefix affinity over two cores, and one of two cores killed mid-stream.

(The load test with disconnects runs at data parallel 2 too: ``test_load.py``'s ``dp2`` server.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .serve_helpers import MODEL_NAME, ServerThread, metric_values, serve, wait_healthy
from .test_faults import _family, _gone, _streams_until, cli_server

PREFIX = "You are a careful assistant. Answer in one short sentence, citing the shared document below. " * 6


@pytest.fixture(scope="module")
def dp_server(loaded: Any) -> Iterator[ServerThread]:
    with serve(loaded, mode="dp2") as s:
        yield s


def _metrics(url: str) -> dict[str, float]:
    return metric_values(httpx.get(f"{url}/metrics").text)


def _complete(url: str, prompt: str) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


async def _complete_many(url: str, prompts: list[str]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=60) as http:

        async def one(prompt: str) -> dict[str, Any]:
            body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
            r = await http.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 200, r.text
            result: dict[str, Any] = r.json()
            return result

        return await asyncio.gather(*(one(p) for p in prompts))


def test_requests_sharing_a_prefix_land_on_one_core_and_hit_its_cache(dp_server: ServerThread) -> None:
    url = dp_server.url
    before = _metrics(url)
    first = _complete(url, PREFIX + "Question 0: what is it about?")
    prompt_tokens = first["usage"]["prompt_tokens"]
    # Then a burst sharing the prefix (different endings), and unrelated prompts meanwhile.
    shared = [PREFIX + f"Question {i}: what does part {i} say?" for i in range(1, 7)]
    others = [f"Unrelated request {i}." for i in range(4)]
    results = asyncio.run(_complete_many(url, shared + others))
    after = _metrics(url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    affinity = {e: delta(f"paged_dp_routed_requests_total{{engine={e},route=affinity}}") for e in "01"}
    home = max(affinity, key=lambda e: affinity[e])
    away = "1" if home == "0" else "0"
    # All six followers went where the first one was: affinity, none to the other core.
    assert affinity == {home: 6, away: 0}, affinity
    assert delta(f"paged_dp_routed_requests_total{{engine={home},route=balance}}") >= 1  # the first request
    hits = {e: delta(f"paged_prefix_cache_hits_tokens_total{{engine={e}}}") for e in "01"}
    queries = {e: delta(f"paged_prefix_cache_queries_tokens_total{{engine={e}}}") for e in "01"}
    assert hits[away] == 0
    assert hits[home] >= 6 * (prompt_tokens // 2), (hits, prompt_tokens)
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results[:6]]
    assert all(c >= prompt_tokens // 2 for c in cached), cached
    ratio = after[f"paged_prefix_cache_hit_ratio{{engine={home}}}"]
    print(
        f"prefix affinity: 6 of 6 followers on core {home}; its prefix hit rate {hits[home] / queries[home]:.1%} "
        f"in this test ({hits[home]:.0f} of {queries[home]:.0f} prompt tokens), {ratio:.1%} since start; "
        f"core {away}: {hits[away]:.0f} hits of {queries[away]:.0f}; cached tokens per follower {cached}"
    )
    # The unrelated prompts were balanced (both cores got work).
    balanced = {e: delta(f"paged_dp_routed_requests_total{{engine={e},route=balance}}") for e in "01"}
    assert balanced[away] >= 1, balanced


def test_health_lists_both_cores_while_they_serve(dp_server: ServerThread) -> None:
    body = httpx.get(f"{dp_server.url}/health").json()
    assert body["status"] == "ok"
    assert [(e["engine"], e["status"]) for e in body["engines"]] == [(0, "ok"), (1, "ok")]
    m = _metrics(dp_server.url)
    assert m["paged_engine_up{engine=0}"] == 1 and m["paged_engine_up{engine=1}"] == 1


STREAMS = 8


@pytest.mark.serial  # a bound on how fast the streams end
def test_one_of_two_cores_killed_fails_only_its_streams(tiny_model_dir: Path, backend_name: str) -> None:
    with cli_server(tiny_model_dir, backend_name, "--served-model-name", "tiny", "--data-parallel-size", "2") as (
        proc,
        url,
        _,
    ):
        wait_healthy(url, headers={}, timeout=180, proc=proc)
        family = _family(proc.pid)
        engines = httpx.get(f"{url}/health").json()["engines"]
        victim = engines[1]["pid"]
        assert {p.pid for p in family[1:]} >= {e["pid"] for e in engines}
        streams, killed_at = asyncio.run(
            _streams_until(url, lambda: os.kill(victim, signal.SIGKILL), streams=STREAMS, max_tokens=300)
        )
        failed = [(lines, ended) for lines, ended in streams if lines[-1] != "[DONE]" or "error" in lines[-2]]
        done = [lines for lines, _ in streams if lines[-1] == "[DONE]" and "error" not in lines[-2]]
        # The router alternated the short prompts over the two cores: half failed, half completed.
        assert len(failed) == STREAMS // 2 and len(done) == STREAMS // 2, [s[0][-2:] for s in streams]
        for lines, ended in failed:
            assert lines[-1] == "[DONE]"
            message = json.loads(lines[-2])["error"]["message"]
            assert "engine core 1 died: the engine core process died (killed by SIGKILL)" in message, message
            assert ended - killed_at < 1.0, f"a stream took {ended - killed_at:.2f} s to end"
        for lines in done:
            assert json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
        health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        dead = health.json()["engines"][1]
        assert dead["status"] == "dead" and "killed by SIGKILL" in dead["reason"], dead
        m = metric_values(httpx.get(f"{url}/metrics").text)
        assert m["paged_engine_up{engine=0}"] == 1 and m["paged_engine_up{engine=1}"] == 0
        for i in range(4):  # new requests all succeed, on the live core
            r = httpx.post(
                f"{url}/v1/completions", json={"model": "tiny", "prompt": f"after {i}", "max_tokens": 3}, timeout=30
            )
            assert r.status_code == 200, r.text
        assert proc.poll() is None, "the server must keep serving on the live core"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(p) for p in family), [p.pid for p in family if not _gone(p)]
