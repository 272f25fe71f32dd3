"""The ``paged bench serve`` client loop against a fake ``AsyncOpenAI``: concurrency bound, order, usage, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from paged_bench.serve_client import run_clients
from paged_bench.workloads import BenchRequest


class FakeCompletions:
    """Streams ``max_tokens`` one-letter chunks and a usage chunk; fails prompts starting with id 13."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.calls: list[dict[str, Any]] = []

    async def create(self, **kw: Any) -> AsyncIterator[Any]:
        self.calls.append(kw)
        if kw["prompt"][0] == 13:
            raise ConnectionError("refused")
        return self._stream(kw["max_tokens"], len(kw["prompt"]))

    async def _stream(self, n: int, prompt_len: int) -> AsyncIterator[Any]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            for _ in range(n):
                await asyncio.sleep(0.001)
                yield SimpleNamespace(choices=[SimpleNamespace(text="x")], usage=None)
            yield SimpleNamespace(choices=[], usage=SimpleNamespace(completion_tokens=n, prompt_tokens=prompt_len))
        finally:
            self.in_flight -= 1


def test_run_clients_bounds_streams_and_keeps_workload_order() -> None:
    fake = FakeCompletions()
    client = SimpleNamespace(completions=fake)
    reqs = [BenchRequest([100 + i] * (i + 1), max_tokens=i + 2) for i in range(7)]
    timelines, seconds = asyncio.run(run_clients(client, "m", reqs, concurrency=3))
    assert seconds > 0 and fake.peak == 3
    assert [t.usage_tokens for t in timelines] == [i + 2 for i in range(7)]
    assert [t.prompt_tokens for t in timelines] == [i + 1 for i in range(7)]
    assert all(len(t.chunks) == t.usage_tokens and t.ttft is not None and t.ttft > 0 for t in timelines)
    call = fake.calls[0]
    assert call["stream"] is True and call["stream_options"] == {"include_usage": True}
    assert call["extra_body"] == {"ignore_eos": True} and call["temperature"] == 0.0


def test_a_failed_request_is_recorded_and_the_rest_run() -> None:
    client = SimpleNamespace(completions=FakeCompletions())
    reqs = [BenchRequest([100], 2), BenchRequest([13], 2), BenchRequest([101], 2)]
    timelines, _ = asyncio.run(run_clients(client, "m", reqs, concurrency=2))
    assert [t.error is None for t in timelines] == [True, False, True]
    assert timelines[1].error == "ConnectionError: refused"
    assert timelines[1].prompt_tokens == 1  # from the request, since no usage came


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(run_clients(SimpleNamespace(), "m", [BenchRequest([100], 1)], concurrency=0))
