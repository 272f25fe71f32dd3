"""Asynchronous scheduling on the tiny engine: the same outputs as the synchronous loop, step N+1 planned early.

Each case runs one batch of varied requests through an engine with ``async_scheduling`` off and one with it
on, and compares every sequence's tokens, finish and stop reasons and logprobs.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch

from paged_core.cli.engine_args import add_engine_args, engine_config_from
from paged_core.engine_config import EngineConfig
from paged_core.engine_core.beam_params import BeamParams
from paged_core.errors import ConfigError
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.frontend.outputs import RequestOutput
from paged_core.sampling.params import SamplingParams
from paged_core.structured import StructuredOutputs

from ..engine_helpers import all_blocks_free, make_engine, run_to_end

STOPS = tuple(range(0, 256, 7))
"""Stop ids common enough that sampled sequences end early, at a step nobody planned for."""


def batch() -> list[tuple[list[int], SamplingParams, BeamParams | None]]:
    """Prompts of many lengths under greedy, seeded, n > 1, stop ids and strings, penalties, logprobs, a grammar."""
    cases: list[tuple[list[int], SamplingParams, BeamParams | None]] = []
    for i in range(14):
        prompt = [(i * 37 + j * 11) % 250 for j in range(3 + (i * 5) % 26)]
        kind = i % 7
        if kind == 0:
            params = SamplingParams(temperature=0.0, max_tokens=4 + i % 9)
        elif kind == 1:
            params = SamplingParams(temperature=1.0, seed=i, max_tokens=1 + i % 12, stop_token_ids=list(STOPS))
        elif kind == 2:
            params = SamplingParams(temperature=0.9, seed=i, n=2, max_tokens=6, min_tokens=2, stop_token_ids=[3, 9])
        elif kind == 3:
            params = SamplingParams(temperature=1.0, seed=i, top_k=20, repetition_penalty=1.3, logprobs=2, max_tokens=9)
        elif kind == 4:
            params = SamplingParams(temperature=1.0, seed=i, stop=["a", "e"], max_tokens=12, ignore_eos=False)
        elif kind == 5:
            choice = StructuredOutputs(choice=["red", "green", "blue"])
            params = SamplingParams(temperature=1.0, seed=i, max_tokens=10, structured_outputs=choice)
        else:
            params = SamplingParams(temperature=0.7, seed=i, presence_penalty=0.5, min_p=0.05, max_tokens=11)
        cases.append((prompt, params, None))
    return cases


def outputs(engine: LLMEngine, cases: list[tuple[list[int], SamplingParams, BeamParams | None]]) -> dict[str, Any]:
    """Run ``cases`` to the end; per request, each sequence's tokens, finish, stop reason and logprobs."""
    for n, (prompt, params, beam) in enumerate(cases):
        engine.add_request(prompt, params, request_id=f"r{n}", beam=beam)
    final: dict[str, RequestOutput] = run_to_end(engine)
    assert not engine.has_unfinished_requests() and all_blocks_free(engine)
    return {
        rid: [(o.token_ids, o.finish_reason, o.stop_reason, o.logprobs) for o in out.outputs] + [out.error]
        for rid, out in sorted(final.items())
    }


def both(loaded: Any, cases: Any, runs: int = 1, **config: Any) -> tuple[list[Any], LLMEngine]:
    """The outputs of ``runs`` passes over ``cases`` with the loop in turn and overlapped; asserts they are equal."""
    results = []
    for flag in (False, True):
        engine = make_engine(loaded, async_scheduling=flag, **config)
        assert engine.core.async_scheduling is flag
        results.append([outputs(engine, cases) for _ in range(runs)])
    assert results[0] == results[1]
    return results[0], engine


def test_a_varied_batch_gives_the_same_outputs_and_overlaps(tiny_loaded: Any) -> None:
    (out,), engine = both(tiny_loaded, batch())
    stats = engine.core.overlap
    assert stats.overlapped > 10 and stats.in_turn.get("n > 1 forks", 0) > 0
    reasons = {o[1] for seqs in out.values() for o in seqs[:-1]}
    assert reasons == {"stop", "length"}  # stops found a step late were discarded, not reported


def test_chunked_prefill_and_prefix_hits(tiny_loaded: Any) -> None:
    # A budget of 8 tokens chunks every prompt; the second pass hits the prompts cached by the first.
    (first, second), engine = both(tiny_loaded, batch(), runs=2, max_num_batched_tokens=8, max_num_seqs=6)
    assert engine.core.scheduler.kv.stats.hits > 0 and engine.core.overlap.overlapped > 20
    greedy = [rid for rid, (prompt, params, _) in zip(first, batch(), strict=False) if params.temperature == 0.0]
    assert all(first[rid] == second[rid] for rid in greedy)


def test_preemption(tiny_loaded: Any) -> None:
    (out,), engine = both(tiny_loaded, batch(), num_blocks=14)
    assert engine.core.scheduler.num_preemptions > 0 and engine.core.overlap.overlapped > 0
    assert all(seqs[-1] is None for seqs in out.values())


def test_beam_search_runs_in_turn(tiny_loaded: Any) -> None:
    cases = [*batch()[:4], ([5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=5), BeamParams(3))]
    _, engine = both(tiny_loaded, cases)
    assert engine.core.overlap.in_turn.get("beam search", 0) > 0


def test_speculative_decoding_keeps_the_loop_in_turn(tiny_loaded: Any) -> None:
    engine = make_engine(tiny_loaded, async_scheduling=True, speculative="ngram")
    assert engine.core.async_scheduling is False


def test_the_default_is_off_on_cpu(tiny_loaded: Any) -> None:
    engine = make_engine(tiny_loaded)
    assert engine.core.runner.device.type == "cpu" and engine.core.async_scheduling is False


def test_an_abort_while_a_step_is_in_flight(tiny_loaded: Any) -> None:
    engine = make_engine(tiny_loaded, async_scheduling=True)
    keep = engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=6))
    gone = engine.add_request([4, 5, 6], SamplingParams(temperature=0.0, max_tokens=6))
    engine.step()
    engine.step()
    assert engine.core._in_flight is not None  # the third step runs while the second's tokens are applied
    engine.abort_request([gone])
    final = run_to_end(engine)
    assert len(final[keep].outputs[0].token_ids) == 6 and gone not in final and all_blocks_free(engine)
    assert gone not in engine.core.sampled and engine.core.overlap.overlapped >= 3


def test_a_failed_forward_in_flight_ends_only_its_requests(tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(tiny_loaded, async_scheduling=True, max_num_seqs=2)
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
    assert list(engine.core.sampled.groups) == [waiting]
    final = run_to_end(engine)
    assert final[waiting].error is None and len(final[waiting].outputs[0].token_ids) == 3
    assert all_blocks_free(engine) and engine.core.overlap.overlapped > 0


def test_the_switch_from_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from(parser.parse_args([])).scheduler.async_scheduling is None
    assert engine_config_from(parser.parse_args(["--async-scheduling"])).scheduler.async_scheduling is True
    assert engine_config_from(parser.parse_args(["--no-async-scheduling"])).scheduler.async_scheduling is False
    with pytest.raises(ConfigError, match="async_scheduling must be True or False"):
        EngineConfig.of(async_scheduling="yes")
