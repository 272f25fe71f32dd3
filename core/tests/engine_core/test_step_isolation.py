"""A step never fails every tenant: a row the sampler cannot serve ends alone; a failed forward ends its step's rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from paged_core.frontend.llm_engine import LLMEngine
from paged_core.frontend.outputs import RequestOutput
from paged_core.sampling.params import SamplingParams
from paged_core.sampling.sampler import SamplerOutput, SamplingState

from ..engine_helpers import all_blocks_free, make_engine

POISON_SEED = 666  # the row whose sampling is made to fail


def poison_sampler(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every sampler call that includes the poisoned row raise; returns the batch sizes it was called with."""
    real = engine.core.sampler.sample
    calls: list[int] = []

    def sample(logits: torch.Tensor, states: Sequence[SamplingState], num_samples: Any = None) -> SamplerOutput:
        calls.append(len(states))
        if any(s.params.seed == POISON_SEED for s in states):
            raise OverflowError("Overflow when unpacking long long")
        return real(logits, states, num_samples)

    monkeypatch.setattr(engine.core.sampler, "sample", sample)
    return calls


def step_all(engine: LLMEngine) -> tuple[dict[str, RequestOutput], dict[str, str]]:
    """Step to the end; the final outputs and every request any step reported as failed."""
    final: dict[str, RequestOutput] = {}
    failed: dict[str, str] = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            return final, failed
        outputs = engine.step()
        failed.update(engine.failed)
        final.update({o.request_id: o for o in outputs if o.finished})
    raise AssertionError("requests did not finish")


@pytest.mark.parametrize("n", [1, 2])
def test_a_row_that_cannot_be_sampled_fails_alone(tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    engine = make_engine(tiny_loaded)
    calls = poison_sampler(engine, monkeypatch)
    good = [engine.add_request([1, 2, 3 + i], SamplingParams(max_tokens=4, seed=i, top_k=5)) for i in range(3)]
    bad = engine.add_request([9, 9, 9], SamplingParams(max_tokens=4, seed=POISON_SEED, n=n, top_k=7))
    final, failed = step_all(engine)
    assert list(failed) == [bad] and "sampling failed for this request (OverflowError)" in failed[bad]
    assert final[bad].error == failed[bad] and final[bad].outputs == []
    for rid in good:
        assert final[rid].error is None and len(final[rid].outputs[0].token_ids) == 4
    assert calls[0] == 4 and calls[1:5] == [1, 1, 1, 1]  # the batch, then each row alone
    assert all_blocks_free(engine)


def test_a_failed_forward_ends_only_the_requests_of_that_step(
    tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_loaded, max_num_seqs=2)
    first = [engine.add_request([1, 2, i + 3], SamplingParams(max_tokens=3, seed=i)) for i in range(2)]
    waiting = engine.add_request([7, 8], SamplingParams(max_tokens=3, seed=5))
    real = engine.core.runner.forward

    def broken(batch: Any) -> torch.Tensor:
        monkeypatch.setattr(engine.core.runner, "forward", real)  # fails once
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.core.runner, "forward", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    assert sorted(engine.failed) == sorted(first)
    assert all("the engine step running this request failed (RuntimeError)" == m for m in engine.failed.values())
    assert list(engine.core.sampled.groups) == [waiting]
    final, failed = step_all(engine)
    assert not failed and final[waiting].error is None and len(final[waiting].outputs[0].token_ids) == 3
    assert all_blocks_free(engine)


def test_a_failed_step_after_sampling_reports_every_request_it_ran(
    tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failure after some requests already finished in the step: they are reported too (their output is lost).
    engine = make_engine(tiny_loaded)
    ids = [engine.add_request([1, 2, i + 3], SamplingParams(max_tokens=1 + i, seed=i)) for i in range(2)]

    real = engine.core.sampled.emit

    def broken(*args: Any) -> Any:
        real(*args)  # the step's requests are updated (and some finished) before the failure
        raise RuntimeError("emit failed")

    monkeypatch.setattr(engine.core.sampled, "emit", broken)
    with pytest.raises(RuntimeError, match="emit failed"):
        engine.step()
    assert sorted(engine.failed) == sorted(ids) and not engine.core.sampled.groups and all_blocks_free(engine)


def test_failed_is_reset_by_each_step(tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(tiny_loaded)
    poison_sampler(engine, monkeypatch)
    bad = engine.add_request([3, 4], SamplingParams(max_tokens=2, seed=POISON_SEED))
    engine.add_request([3, 5], SamplingParams(max_tokens=3, seed=1))
    engine.step()
    assert list(engine.failed) == [bad]
    engine.step()
    assert engine.failed == {}
