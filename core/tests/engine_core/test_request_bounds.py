"""LLMEngine.add_request bounds request data against the model: stop ids in the vocabulary, top_k clamped."""

from __future__ import annotations

from typing import Any

import pytest

from paged_core.errors import RequestRejectedError
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.sampling.params import SamplingParams

from ..engine_helpers import VOCAB, all_blocks_free, make_engine, run_to_end


@pytest.fixture(scope="module")
def engine(tiny_loaded: Any) -> LLMEngine:
    return make_engine(tiny_loaded)


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 1, 2**63 - 1])
def test_stop_token_id_outside_the_vocabulary_is_refused(engine: LLMEngine, bad: int) -> None:
    with pytest.raises(RequestRejectedError) as info:
        engine.add_request([1, 2, 3], SamplingParams(stop_token_ids=[5, bad], min_tokens=1))
    message = str(info.value)
    assert "SamplingParams.stop_token_ids" in message and f"[0, {VOCAB})" in message and str(bad) in message
    assert not engine.core.sampled.groups and all_blocks_free(engine)


def test_last_vocabulary_id_is_a_valid_stop_id(engine: LLMEngine) -> None:
    rid = engine.add_request([1, 2, 3], SamplingParams(stop_token_ids=[VOCAB - 1], min_tokens=1, max_tokens=2))
    assert engine.core.sampled.groups[rid].request.params.stop_token_ids == (VOCAB - 1,)
    engine.abort_request([rid])


@pytest.mark.parametrize("top_k", [VOCAB + 1, 2**40, 2**63 - 1])
def test_top_k_beyond_the_vocabulary_is_clamped_to_it(engine: LLMEngine, top_k: int) -> None:
    rid = engine.add_request([1, 2, 3], SamplingParams(top_k=top_k, max_tokens=2, seed=1))
    assert engine.core.sampled.groups[rid].request.params.top_k == VOCAB
    # A neighbour with a small top_k puts both rows through the top-k path of one batch.
    other = engine.add_request([4, 5, 6], SamplingParams(top_k=3, max_tokens=2, seed=2))
    final = run_to_end(engine)
    assert all(final[r].error is None and len(final[r].outputs[0].token_ids) == 2 for r in (rid, other))
    assert all_blocks_free(engine)


@pytest.mark.parametrize("top_k", [-1, 0, 1, VOCAB])
def test_top_k_inside_the_vocabulary_is_kept(engine: LLMEngine, top_k: int) -> None:
    rid = engine.add_request([1, 2], SamplingParams(top_k=top_k))
    assert engine.core.sampled.groups[rid].request.params.top_k == top_k
    engine.abort_request([rid])


@pytest.mark.parametrize(
    "priority", [2**63, -(2**63) - 1, 10**5000, 1.5, True], ids=["2**63", "-2**63-1", "10**5000", "float", "bool"]
)
def test_priority_must_fit_int64(engine: LLMEngine, priority: Any) -> None:
    with pytest.raises(RequestRejectedError, match=r"priority must be an int in \[-2\*\*63, 2\*\*63 - 1\]"):
        engine.add_request([1, 2], SamplingParams(), priority=priority)
    assert not engine.core.sampled.groups


def test_priority_at_the_int64_bounds_is_accepted(engine: LLMEngine) -> None:
    ids = [engine.add_request([1, 2], SamplingParams(), priority=p) for p in (2**63 - 1, -(2**63))]
    engine.abort_request(ids)
    assert all_blocks_free(engine)
