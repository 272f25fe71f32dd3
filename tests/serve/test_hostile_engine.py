"""Issue 15, reproductions 1 and 5 over a live server: one request's data can never fail or slow another's step.

1. ``stop_token_ids`` past int64 (with ``min_tokens``) and ``top_k`` past int64 next to another ``top_k`` used to
   raise inside the step and fail every request in flight; now they are refused alone at admission (400), and a
   row that still fails in the sampler fails alone (500 for it, 200 for its neighbours).
5. Stop strings are capped (count and characters) and matched in time that does not grow with their number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
import torch

from paged_core.sampling.params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from paged_core.text.stop import StopStringChecker

from .serve_helpers import MODEL_NAME, ServerThread, make_engine

URL_COMPLETIONS = "/v1/completions"
LONG = {
    "model": MODEL_NAME,
    "prompt": "Tell me a long story",
    "max_tokens": 24,
    "ignore_eos": True,
    "temperature": 0,
    "stream_options": {"include_usage": True},
}
POISON_SEED = 666


@contextlib.contextmanager
def serve_engine(engine: Any) -> Iterator[ServerThread]:
    from paged_core.serve import ServeConfig, build_app

    with ServerThread(build_app(engine, ServeConfig(served_model_name=MODEL_NAME))) as server:
        yield server


@pytest.fixture(scope="module")
def engine(loaded: Any) -> Any:
    return make_engine(loaded)


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[ServerThread]:
    with serve_engine(engine) as s:
        yield s


async def _alongside(url: str, bad: dict[str, Any], neighbour: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    """Start the neighbour's stream, send ``bad`` once it is under way; the bad response and the neighbour's chunks."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async with http.stream("POST", URL_COMPLETIONS, json={**neighbour, "stream": True}) as stream:
            assert stream.status_code == 200
            chunks: list[Any] = []
            lines = stream.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
                    break
            response = await http.post(URL_COMPLETIONS, json=bad)
            async for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
    return response, chunks


def _finish(chunks: list[Any]) -> tuple[str | None, int | None]:
    """The neighbour's finish reason and its completion tokens (from the usage chunk)."""
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    usage = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
    return next((r for r in reversed(reasons) if r), None), usage[-1] if usage else None


def _names_bound(message: str, bound: str | None = None) -> bool:
    """The message names ``bound``, or (None) int64's upper bound, as the schema or SamplingParams writes it."""
    return bound in message if bound is not None else ("9223372036854775807" in message or "2**63 - 1" in message)


def _settled(engine: Any) -> bool:
    """No request left in the engine and every KV block back in the pool (the thread may still be finishing)."""
    for _ in range(100):
        pool = engine.scheduler.kv.pool
        if not engine.scheduler.requests and pool.num_free_blocks == pool.num_usable_blocks:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "extra",
    [
        {"stop_token_ids": [9223372036854775808], "min_tokens": 1},  # past int64: refused by SamplingParams
        {"stop_token_ids": [2**70]},
        {"stop_token_ids": [49152], "min_tokens": 1},  # inside int64 but past the vocabulary: refused by the engine
    ],
)
def test_stop_token_ids_out_of_range_are_a_400_while_a_neighbour_completes(
    server: ServerThread, engine: Any, extra: dict[str, Any]
) -> None:
    bad = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, **extra}
    response, chunks = asyncio.run(_alongside(server.url, bad, LONG))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    # Past int64 the body's schema refuses it (naming the element), else the engine (naming the vocabulary).
    assert error["param"] in ("stop_token_ids", "stop_token_ids.0") and "stop_token_ids" in error["message"]
    assert _names_bound(error["message"], "[0, 49152)" if extra["stop_token_ids"][0] < 2**63 else None)
    assert _finish(chunks) == ("length", 24)
    assert _settled(engine)


def test_top_k_past_int64_is_a_400_and_its_neighbour_with_top_k_a_200(server: ServerThread, engine: Any) -> None:
    neighbour = {**LONG, "temperature": 0.8, "top_k": 5, "seed": 1}
    bad = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0.8, "top_k": 9223372036854775808}
    response, chunks = asyncio.run(_alongside(server.url, bad, neighbour))
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_k", response.text
    assert _names_bound(response.json()["error"]["message"])
    assert _finish(chunks) == ("length", 24)
    # Inside int64 but far past the vocabulary: clamped to it (every token kept), served next to a top_k row.
    ok, chunks = asyncio.run(_alongside(server.url, {**bad, "top_k": 2**63 - 1}, neighbour))
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert _finish(chunks) == ("length", 24)
    assert _settled(engine)


def test_too_many_stop_strings_are_a_400_naming_the_limit(server: ServerThread) -> None:
    base = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
    r = httpx.post(f"{server.url}{URL_COMPLETIONS}", json={**base, "stop": ["a"] * 100_000}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stop" and f"at most {MAX_STOP_STRINGS} strings" in error["message"]
    assert "got 100000" in error["message"] and len(error["message"]) < 200
    r = httpx.post(f"{server.url}{URL_COMPLETIONS}", json={**base, "stop": ["b" * (MAX_STOP_CHARS + 1)]}, timeout=60)
    assert r.status_code == 400 and f"at most {MAX_STOP_CHARS} characters" in r.json()["error"]["message"]


def test_the_most_stop_strings_allowed_cost_a_bounded_work_per_character(
    server: ServerThread, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The largest stop list a request may send: 64 strings, 4096 characters, whose prefixes are common text.
    width = MAX_STOP_CHARS // MAX_STOP_STRINGS
    stops = [(" the" * width)[: width - 1] + chr(0x2603 + i) for i in range(MAX_STOP_STRINGS)]
    assert sum(map(len, stops)) == MAX_STOP_CHARS
    real = StopStringChecker.feed
    work: dict[int, list[int]] = {}

    def counted(self: StopStringChecker, delta: str) -> tuple[str, str | None]:
        result = real(self, delta)
        if len(self.stop) == MAX_STOP_STRINGS:
            fed = work.setdefault(id(self), [0, 0])
            fed[0] += len(delta)
            fed[1] = self.steps
        return result

    monkeypatch.setattr(StopStringChecker, "feed", counted)
    heavy = {**{k: v for k, v in LONG.items() if k != "stream_options"}, "prompt": "the the the the", "stop": stops}
    response, chunks = asyncio.run(_alongside(server.url, heavy, LONG))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 24
    assert _finish(chunks) == ("length", 24)
    # The engine's matching work for the heavy request: at most two automaton steps per character of text,
    # the same bound as for one stop string; the old matcher scanned every string on every token.
    assert work and all(steps <= 2 * chars for chars, steps in work.values())
    assert _settled(engine)


def test_a_row_the_sampler_cannot_serve_fails_alone(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(loaded)
    real = engine.sampler.sample

    def sample(logits: torch.Tensor, states: Sequence[Any], num_samples: Any = None) -> Any:
        if any(s.params.seed == POISON_SEED for s in states):
            raise OverflowError("Overflow when unpacking long long")
        return real(logits, states, num_samples)

    monkeypatch.setattr(engine.sampler, "sample", sample)
    victim = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "seed": POISON_SEED, "temperature": 0.7}
    with serve_engine(engine) as server:
        response, chunks = asyncio.run(_alongside(server.url, victim, {**LONG, "seed": 3, "temperature": 0.7}))
        assert response.status_code == 500, response.text
        assert response.json()["error"]["type"] == "server_error"
        assert _finish(chunks) == ("length", 24)
        # Streamed, the victim's stream ends with an error event; the server goes on serving.
        with httpx.stream("POST", f"{server.url}{URL_COMPLETIONS}", json={**victim, "stream": True}, timeout=60) as s:
            events = [json.loads(e[6:]) for e in s.iter_lines() if e.startswith("data: ") and e != "data: [DONE]"]
        assert events and "error" in events[-1]
        ok = httpx.post(f"{server.url}{URL_COMPLETIONS}", json={**victim, "seed": 4}, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert _settled(engine)
