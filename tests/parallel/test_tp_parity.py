"""Tensor parallel 2 gives tensor parallel 1's greedy streams, token for token, and its logprobs within 2e-5.

The tolerance is relative to the value's size (``|a - b| <= 2e-5 * max(1, |a|)``): the tiny model's
wide weights make logprobs of -20 and below, where fp32 summing the partial sums in another order
moves the last digits. A logprob is ``logit - logsumexp(logits)`` and each term carries the logits' own
error (bounded by 1e-5 of their size below), hence twice that bound (measured: 1.5e-5 absolute on a -40
logprob on Zen 4, 1.22e-5 relative on a Sapphire Rapids Xeon, whose oneDNN kernels sum in another order).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_core import LLM, RequestOutput

from .tp_helpers import ENGINE, worker_pids, workload

pytestmark = pytest.mark.serial  # two ranks, each with its share of every core


def _run(llm: LLM) -> list[RequestOutput]:
    prompts, params = workload()
    return llm.generate(prompts, params, use_tqdm=False)


def _logits_per_step(llm: LLM) -> list[torch.Tensor]:
    """Run the workload, keeping every step's logits ``[K, V]`` as rank 0's runner returned them."""
    runner = llm.engine.core.runner
    seen: list[torch.Tensor] = []
    execute = runner.execute

    def spy(out: Any) -> Any:
        ids, counts, logits = execute(out)
        if logits is not None:
            seen.append(logits.detach().clone())
        return ids, counts, logits

    runner.execute = spy  # type: ignore[method-assign]
    try:
        _run(llm)
    finally:
        del runner.execute
    return seen


@pytest.fixture(scope="module", params=["fused", "transformers"])
def impl(request: pytest.FixtureRequest) -> str:
    """Both model paths: the fused decoder reduces itself, transformers' modules through hooks."""
    return str(request.param)


@pytest.fixture(scope="module")
def tp1(tiny_llama: Path, impl: str) -> Iterator[LLM]:
    with LLM(str(tiny_llama), model_impl=impl, **ENGINE) as llm:
        yield llm


@pytest.fixture(scope="module")
def tp2(tiny_llama: Path, impl: str) -> Iterator[LLM]:
    with LLM(str(tiny_llama), tensor_parallel_size=2, model_impl=impl, **ENGINE) as llm:
        yield llm
    assert worker_pids() == [], "closing the engine left a worker behind"


def test_streams_and_logprobs_match_tensor_parallel_1(tp1: LLM, tp2: LLM) -> None:
    one, two = _run(tp1), _run(tp2)
    worst = 0.0
    for a, b in zip(one, two, strict=True):
        assert a.error is None and b.error is None
        assert len(a.outputs) == len(b.outputs)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert x.token_ids == y.token_ids, f"{a.request_id}#{x.index} diverged"
            assert x.logprobs is not None and y.logprobs is not None
            for pa, pb in zip(x.logprobs, y.logprobs, strict=True):
                assert pa.keys() == pb.keys()
                worst = max(worst, *(abs(pa[t] - pb[t]) / max(1.0, abs(pa[t])) for t in pa))
    assert worst < 2e-5, f"logprobs differ by {worst:.2e} (relative)"
    # The workload really exercised what the scheduler does, on the rank that schedules.
    core = tp2.engine.core
    stats = core.stats()
    assert stats.num_preemptions > 0 and stats.prefix_hits > 0
    assert core.runner.num_block_copies > 0  # n=2 forks wrote into a shared block
    assert core.facts().num_usable_blocks == tp1.engine.core.facts().num_usable_blocks


def test_a_second_run_on_the_same_ranks_matches_too(tp1: LLM, tp2: LLM) -> None:
    # The workers carry state between runs (rows retired by later plans, a warm prefix cache on rank 0's
    # side deciding what they skip): a drift there would show as different tokens now.
    one, two = _run(tp1), _run(tp2)
    assert [[c.token_ids for c in o.outputs] for o in one] == [[c.token_ids for c in o.outputs] for o in two]
    assert sum(o.metrics.num_cached_tokens for o in two) > 0
    assert len(worker_pids()) == 1


def test_every_step_s_logits_match_within_1e_5(tp1: LLM, tp2: LLM) -> None:
    assert tp1.engine.reset_prefix_cache() and tp2.engine.reset_prefix_cache()
    one, two = _logits_per_step(tp1), _logits_per_step(tp2)
    assert len(one) == len(two) > 30  # the same schedule, step for step
    worst = max(float((a - b).abs().max()) for a, b in zip(one, two, strict=True))
    scale = max(float(a.abs().max()) for a in one)
    print(f"max |logit difference| {worst:.2e} over {len(one)} steps (largest |logit| {scale:.1f})")
    assert worst < 1e-5 * max(1.0, scale), f"logits differ by {worst:.2e} (largest logit {scale:.1f})"
