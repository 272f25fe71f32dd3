"""Asynchronous scheduling on the embedded SmolLM2: token for token the synchronous loop's outputs.

The same prompts, half greedy and half seeded sampling, run through the loop in turn and overlapped
(``async_scheduling``): all together and again with whole-prompt prefix hits, then with chunked prefill
and preemption forced by a small token budget and a small KV cache. Speculative decoding keeps the loop
in turn (see :mod:`paged_core.engine_core.overlap`).
"""

from __future__ import annotations

import pytest

from paged_core import LLM, SamplingParams

from .e2e_helpers import mixed_prompts


@pytest.fixture(scope="module")
def prompts(smol_base: LLM) -> list[list[int]]:
    return mixed_prompts(smol_base.tokenizer, 12, seed=3, longest=160)


def params(count: int) -> list[SamplingParams]:
    """Greedy and seeded sampling in turn; EOS and varied lengths end some early, at steps nobody planned for."""
    return [
        SamplingParams(temperature=0.0, max_tokens=6 + i % 9)
        if i % 2 == 0
        else SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i, max_tokens=6 + i % 9)
        for i in range(count)
    ]


def run(llm: LLM, prompts: list[list[int]], passes: int) -> list[list[list[int]]]:
    sampling = params(len(prompts))
    return [[o.outputs[0].token_ids for o in llm.generate(prompts, sampling, use_tqdm=False)] for _ in range(passes)]


def compare(smol_base: LLM, prompts: list[list[int]], passes: int, **config: object) -> LLM:
    """Assert both loops give the same tokens; the overlapped engine, for its figures."""
    in_turn = smol_base.reconfigured(async_scheduling=False, **config)
    overlapped = smol_base.reconfigured(async_scheduling=True, **config)
    assert overlapped.engine.core.async_scheduling and not in_turn.engine.core.async_scheduling
    assert run(overlapped, prompts, passes) == run(in_turn, prompts, passes)
    assert overlapped.engine.core.overlap.overlapped > 0
    return overlapped


def test_together_and_with_prefix_hits(smol_base: LLM, prompts: list[list[int]]) -> None:
    llm = compare(smol_base, prompts, passes=2)
    assert llm.engine.core.scheduler.kv.stats.hits > sum(len(p) for p in prompts) // 2  # the second pass hit


def test_chunked_prefill_and_preemption(smol_base: LLM, prompts: list[list[int]]) -> None:
    # 48 tokens a step chunks every prompt; 19 usable blocks of 16 hold about a third of the batch at once.
    llm = compare(smol_base, prompts, passes=1, max_num_batched_tokens=48, max_num_seqs=8, num_blocks=20, block_size=16)
    assert llm.engine.core.scheduler.num_preemptions > 0


def test_speculative_decoding_runs_in_turn(smol_base: LLM, prompts: list[list[int]]) -> None:
    llm = smol_base.reconfigured(async_scheduling=True, speculative="ngram")
    assert not llm.engine.core.async_scheduling
    llm.generate(prompts[:2], params(2), use_tqdm=False)
    assert llm.engine.core.overlap.overlapped == 0 and llm.engine.core.spec_stats.verify_rows > 0
