"""The engine core in a child process gives the same outputs as in-process, and survives junk on its socket."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import psutil
import pytest

from paged_core import LLM, SamplingParams

from .conftest import fast_backend
from .e2e_helpers import GREEDY, assert_same_tokens

pytestmark = pytest.mark.usefixtures("exact_activations")  # parity with transformers: exact fp32 activations


@pytest.fixture(scope="module")
def smol_mp() -> Iterator[LLM]:
    """:func:`smol_base`'s configuration with its engine core in a child process."""
    with LLM(backend=fast_backend(), dtype="float32", kv_cache_memory="512MiB", multiprocess=True) as llm:
        yield llm


def test_greedy_battery_matches_transformers_multiprocess(
    smol_mp: LLM, prompts32: list[list[int]], hf32: list[list[int]]
) -> None:
    assert_same_tokens(smol_mp.generate(prompts32, GREEDY, use_tqdm=False), hf32)
    # Again: now every prompt hits the prefix cache, and the tokens are still transformers'.
    again = smol_mp.generate(prompts32, GREEDY, use_tqdm=False)
    assert_same_tokens(again, hf32)
    assert sum(o.metrics.num_cached_tokens for o in again) > 0


def test_seeded_sampling_streams_are_identical_in_and_out_of_process(smol_base: LLM, smol_mp: LLM) -> None:
    prompts = ["The old lighthouse keeper", "In a distant galaxy", "Paged attention is"]
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=24, logprobs=2),
        SamplingParams(temperature=0.7, top_k=40, seed=12, n=3, max_tokens=20, stop=[" the"]),
        SamplingParams(temperature=1.0, min_p=0.05, seed=13, max_tokens=20, repetition_penalty=1.2),
    ]
    ours = smol_base.generate(prompts, params, use_tqdm=False)
    theirs = smol_mp.generate(prompts, params, use_tqdm=False)
    for a, b in zip(ours, theirs, strict=True):
        assert len(a.outputs) == len(b.outputs)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert (x.token_ids, x.text, x.finish_reason, x.logprobs) == (
                y.token_ids,
                y.text,
                y.finish_reason,
                y.logprobs,
            )


def test_streaming_deltas_rebuild_the_same_text(smol_mp: LLM) -> None:
    params = replace(GREEDY, max_tokens=12)
    steps = list(smol_mp.stream("Tell me about rivers", params))
    final = steps[-1].outputs[0]
    assert final.finished and "".join(s.outputs[0].new_text for s in steps) == final.text


def test_junk_on_the_engine_socket_is_dropped(smol_mp: LLM) -> None:
    # The core's only peer is its front end (the core connects to the front end's 0700 directory), so junk can
    # only come from there: a bug or a version mismatch. Send it on the front end's own socket.
    process = smol_mp.engine.client.transport  # type: ignore[attr-defined]
    process.to_core.send(b"\xc1 not msgpack")
    process.to_core.send(b"\x81\xa4type\xa3add")  # msgpack for {"type": "add"}: a tagged message missing its fields
    process.to_core.send(b"\0" * (17 << 20))
    out = smol_mp.generate(["Hello there"], replace(GREEDY, max_tokens=4), use_tqdm=False)[0]
    assert out.error is None and len(out.outputs[0].token_ids) == 4
    # Logged by the core (its stderr; core/tests/engine_core/test_core_loop.py checks the lines) and counted:
    assert smol_mp.engine.client.call("dropped_messages") == 3


def test_an_idle_core_blocks_instead_of_spinning(smol_mp: LLM) -> None:
    core = psutil.Process(smol_mp.engine.client.transport.pid)  # type: ignore[attr-defined]
    before = core.cpu_times()
    time.sleep(3.0)
    after = core.cpu_times()
    busy = (after.user - before.user) + (after.system - before.system)
    assert busy < 0.3, f"the idle core used {busy:.2f} s of CPU in 3 s"
