"""The client side of ``paged bench serve``: N concurrent streaming clients through the official ``openai`` client.

Every request is a ``/v1/completions`` call with the workload's prompt token
ids, greedy, EOS ignored and ``max_tokens`` from the workload, streamed with
``stream_options={"include_usage": True}`` so the token count is the
server's own. ``concurrency`` workers take requests in workload order from
one queue: at most ``concurrency`` streams are open at once, and a worker
sends its next request as soon as its stream ends (closed loop, as vLLM's
``benchmark_serving --max-concurrency`` does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from paged_bench.serve_stats import Timeline
from paged_bench.workloads import BenchRequest

REQUEST_TIMEOUT_S = 600.0
"""Per request: a long stream on a slow machine must finish, a hung server must not hang the bench forever."""


def make_client(url: str, api_key: str | None, timeout: float = REQUEST_TIMEOUT_S) -> Any:
    """An ``openai.AsyncOpenAI`` for the server at ``url`` (no retries: a retried request would skew its timing)."""
    import openai

    return openai.AsyncOpenAI(
        base_url=url.rstrip("/") + "/v1", api_key=api_key or "EMPTY", max_retries=0, timeout=timeout
    )


async def served_model(client: Any) -> str:
    """The id of the (first) model the server lists: requests must name it."""
    models = await client.models.list()
    if not models.data:
        raise RuntimeError("the server lists no model")
    return str(models.data[0].id)


async def stream_one(client: Any, model: str, req: BenchRequest, clock_zero: float) -> Timeline:
    """Send ``req`` and record every chunk's arrival; a failure is kept in ``error``, not raised."""
    tl = Timeline(start=time.perf_counter() - clock_zero)
    try:
        stream = await client.completions.create(
            model=model,
            prompt=req.prompt_token_ids,
            max_tokens=req.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            now = time.perf_counter() - clock_zero
            if chunk.choices:
                tl.add_chunk(now, chunk.choices[0].text or "")
            if chunk.usage is not None:
                tl.usage_tokens = chunk.usage.completion_tokens
                tl.prompt_tokens = chunk.usage.prompt_tokens
    except Exception as exc:  # any failure of one request is reported; the run goes on
        tl.error = f"{type(exc).__name__}: {exc}"[:300]
    tl.end = time.perf_counter() - clock_zero
    if tl.prompt_tokens is None:
        tl.prompt_tokens = len(req.prompt_token_ids)
    return tl


async def run_clients(
    client: Any, model: str, requests: Sequence[BenchRequest], concurrency: int
) -> tuple[list[Timeline], float]:
    """Run every request with at most ``concurrency`` in flight; returns timelines (workload order) and wall seconds."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    results: list[Timeline | None] = [None] * len(requests)
    zero = time.perf_counter()

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results[i] = await stream_one(client, model, requests[i], zero)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    seconds = time.perf_counter() - zero
    return [r for r in results if r is not None], seconds


async def bench_server(
    url: str,
    requests: Sequence[BenchRequest],
    concurrency: int,
    api_key: str | None,
    warmup: Sequence[BenchRequest] = (),
) -> tuple[list[Timeline], float, str]:
    """Warm the server up (untimed), then run the timed requests; returns timelines, seconds and the model id."""
    client = make_client(url, api_key)
    try:
        model = await served_model(client)
        if warmup:
            await run_clients(client, model, warmup, concurrency)
        timelines, seconds = await run_clients(client, model, requests, concurrency)
    finally:
        await client.close()
    return timelines, seconds, model
