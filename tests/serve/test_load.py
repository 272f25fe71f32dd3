"""Bounded load: 64 concurrent streaming clients for three rounds, a tenth hanging up mid-stream.

Afterwards no request is left running, the KV cache is empty again, and
``/health`` answered promptly the whole time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from .serve_helpers import MODEL_NAME, MODES, ServerThread, metric_values, serve

pytestmark = pytest.mark.serial  # health checks answered within a bound under load

CLIENTS = 64
ROUNDS = 3


@pytest.fixture(scope="module", params=(*MODES, "dp2"))
def server(request: pytest.FixtureRequest, loaded: Any) -> Iterator[ServerThread]:
    # 2 MiB of KV is 128 blocks: less than 64 clients at full length need, so preemption is exercised too.
    # dp2: the same load over two data-parallel cores (128 blocks each), the metrics summed over them.
    with serve(loaded, max_num_seqs=64, mode=request.param) as s:
        yield s


async def _client(api: AsyncOpenAI, i: int, rnd: int) -> str:
    """One streaming request; every tenth client hangs up after two chunks. Returns 'done' or 'hung up'.

    A client that hangs up asks for 200 tokens, so its request is still running when the server
    notices (with a short one, a loaded machine could finish it first, and there is nothing to abort).
    """
    hang_up = i % 10 == 0
    stream = await api.completions.create(
        model=MODEL_NAME,
        prompt=f"Client {i} in round {rnd} asks for a long story about",
        max_tokens=200 if hang_up else 8 + i % 17,
        temperature=0.8,
        seed=i,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = 0
    finish = None
    async for chunk in stream:
        chunks += 1
        finish = chunk.choices[0].finish_reason or finish
        if hang_up and chunks == 2:
            await stream.close()
            return "hung up"
    assert finish == "length", f"client {i} round {rnd}: finish_reason {finish!r}"
    return "done"


async def _watch_health(url: str, stop: asyncio.Event, seen: list[tuple[int, float]]) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        while not stop.is_set():
            t = time.monotonic()
            r = await http.get(f"{url}/health")
            seen.append((r.status_code, time.monotonic() - t))
            await asyncio.sleep(0.05)


def _settled(url: str, timeout: float = 15.0) -> dict[str, float]:
    """Metrics once nothing is running or waiting (the engine thread may still be applying aborts)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metric_values(httpx.get(f"{url}/metrics").text)
        idle = m["paged_requests_running"] == 0 and m["paged_requests_waiting"] == 0
        if (idle and m["paged_kv_cache_usage_ratio"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


async def _load(url: str) -> tuple[list[str], list[tuple[int, float]]]:
    api = AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=CLIENTS + 8)),
    )
    stop = asyncio.Event()
    health: list[tuple[int, float]] = []
    watcher = asyncio.create_task(_watch_health(url, stop, health))
    results: list[str] = []
    try:
        for rnd in range(ROUNDS):
            results += await asyncio.gather(*(_client(api, i, rnd) for i in range(CLIENTS)))
    finally:
        stop.set()
        await watcher
        await api.close()
    return results, health


def test_load_with_hang_ups_leaves_no_blocks_behind(server: ServerThread) -> None:
    before = metric_values(httpx.get(f"{server.url}/metrics").text)
    results, health = asyncio.run(_load(server.url))
    hung_up = results.count("hung up")
    assert results.count("done") + hung_up == CLIENTS * ROUNDS
    assert hung_up == ROUNDS * len(range(0, CLIENTS, 10))
    after = _settled(server.url)
    assert after["paged_requests_running"] == 0 and after["paged_requests_waiting"] == 0
    assert after["paged_kv_cache_usage_ratio"] == 0.0
    assert after["paged_kv_cache_free_blocks"] == after["paged_kv_cache_blocks"]
    # Every request either finished or was aborted for its vanished client; the hung-up ones mostly aborted.
    finished = after["paged_requests_finished_total{finish_reason=length}"] - before.get(
        "paged_requests_finished_total{finish_reason=length}", 0.0
    )
    aborted = after["paged_requests_aborted_total"] - before["paged_requests_aborted_total"]
    assert finished + aborted == CLIENTS * ROUNDS
    print(f"aborted {aborted} of {hung_up} hung-up clients; finished {finished}")
    assert aborted >= hung_up // 2
    assert len(health) >= 5 and all(code == 200 for code, _ in health)
    assert max(dt for _, dt in health) < 5.0, "health checks must not wait on model steps"


def test_non_streaming_client_that_gives_up_is_aborted(server: ServerThread) -> None:
    before = metric_values(httpx.get(f"{server.url}/metrics").text)["paged_requests_aborted_total"]
    body = {"model": MODEL_NAME, "prompt": "A very long answer please", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    after = _settled(server.url)
    assert after["paged_requests_aborted_total"] == before + 1
    assert after["paged_kv_cache_usage_ratio"] == 0.0


def test_streaming_client_that_hangs_up_frees_its_blocks_at_once(server: ServerThread) -> None:
    before = metric_values(httpx.get(f"{server.url}/metrics").text)
    body = {
        "model": MODEL_NAME,
        "prompt": "Stream a very long answer",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        running = metric_values(httpx.get(f"{server.url}/metrics").text)
        assert running["paged_kv_cache_usage_ratio"] > 0
    after = _settled(server.url, timeout=5)
    assert after["paged_requests_aborted_total"] == before["paged_requests_aborted_total"] + 1
    assert after["paged_kv_cache_usage_ratio"] == 0.0
    generated = after["paged_generation_tokens_total"] - before["paged_generation_tokens_total"]
    assert generated < 300, "the request should stop long before its 400 tokens"
