"""Property: random sampling parameters and prompts, inside and outside every limit, many requests per step.

Refused requests raise :class:`RequestRejectedError` alone (before anything is queued), accepted ones all
finish, no step ever raises or fails a request, and every KV block comes back free.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_core.errors import RequestRejectedError
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.sampling.params import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams

from ..engine_helpers import VOCAB, all_blocks_free, make_engine

MAX_MODEL_LEN = 20  # short, so that max_tokens=2**63 - 1 ends soon (at the length cap)
BIG = [2**63, 2**70, -(2**63) - 1]
TEXT = "ab c\né"
# Per field: values inside its limits, and values outside them (each of which must get the request refused).
FIELDS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "n": (st.integers(1, 2), st.sampled_from([0, -1, 1.5, True, *BIG])),
    "temperature": (
        st.sampled_from([0, 0.0, 1e-7, 0.7, 1, 1.5, 100.0]),
        st.sampled_from([-0.5, math.nan, math.inf, 10**400, "1"]),
    ),
    "top_k": (
        st.sampled_from([-1, 0, 1, 5, VOCAB - 1, VOCAB, VOCAB + 1, 2**40, 2**63 - 1]),
        st.sampled_from([-2, 2.0, *BIG]),
    ),
    "top_p": (st.sampled_from([1.0, 0.9, 0.1, 1e-9]), st.sampled_from([0, 1.5, -1, math.nan, 10**400])),
    "min_p": (st.sampled_from([0, 0.05, 1.0]), st.sampled_from([-0.1, 2, math.inf])),
    "repetition_penalty": (st.sampled_from([1.0, 1.3, 0.5]), st.sampled_from([0, -1, 10**400])),
    "frequency_penalty": (st.sampled_from([-2, 0, 0.5, 2]), st.sampled_from([2.5, -3, 10**400])),
    "presence_penalty": (st.sampled_from([-2, 0, 1.0, 2]), st.sampled_from([2.01, -10, -(10**400)])),
    "seed": (st.sampled_from([None, 0, -1, 7, 2**63 - 1, -(2**63)]), st.sampled_from([1.5, "7", *BIG])),
    "stop": (
        st.one_of(
            st.none(),
            st.lists(st.text(TEXT, min_size=1, max_size=4), max_size=MAX_STOP_STRINGS),
            st.just(["ab" * (MAX_STOP_CHARS // 128)] * MAX_STOP_STRINGS),  # exactly the character limit
        ),
        st.sampled_from([["a"] * (MAX_STOP_STRINGS + 1), ["b" * (MAX_STOP_CHARS + 1)], ["a", ""], 5, [None]]),
    ),
    "stop_token_ids": (
        st.one_of(st.none(), st.lists(st.integers(0, VOCAB - 1), max_size=6)),
        st.sampled_from([[VOCAB], [1, VOCAB + 7], [-1], [2**63 - 1], [2**63], [2**70], [1.0]]),
    ),
    "max_tokens": (st.sampled_from([1, 2, 3, 5, 2**63 - 1]), st.sampled_from([0, -3, None, *BIG])),
    "min_tokens": (st.integers(0, 6), st.sampled_from([-1, *BIG])),
    "logprobs": (st.sampled_from([None, 0, 3, 20]), st.sampled_from([-1, 21, 2**70])),
    "ignore_eos": (st.booleans(), st.sampled_from([1, "yes"])),
    "include_stop_str_in_output": (st.booleans(), st.just(None)),
}
PROMPTS = (
    st.one_of(st.text(TEXT, min_size=1, max_size=6), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)),
    st.sampled_from(["", [], [VOCAB], [-1], [2**70], [True], [1] * (MAX_MODEL_LEN + 1)]),
)
PRIORITIES = (st.sampled_from([0, -5, 3, 2**63 - 1, -(2**63)]), st.sampled_from([2**63, -(2**64), 0.5]))


CROSS = "min_tokens > max_tokens"
BROKEN = [*FIELDS, "prompt", "priority", CROSS]
"""What a request may break: one field, the prompt, the priority, or the one cross-field limit."""


@st.composite
def requests(draw: st.DrawFn) -> tuple[Any, dict[str, Any], int, bool]:
    """(prompt, SamplingParams kwargs, priority, ok): at most one value outside its limits; ``ok`` when none is.

    One violation at most keeps the oracle exact: the request must be refused if and only if it has one.
    """
    broken = draw(st.one_of(st.none(), st.sampled_from(BROKEN)))
    kwargs: dict[str, Any] = {}
    for name, (inside, outside) in FIELDS.items():
        if name == broken:
            kwargs[name] = draw(outside)
        elif draw(st.booleans()):
            kwargs[name] = draw(inside)
    prompt = draw(PROMPTS[broken == "prompt"])
    priority = draw(PRIORITIES[broken == "priority"])
    if broken == CROSS:
        kwargs["max_tokens"] = draw(st.integers(1, 5))
        kwargs["min_tokens"] = kwargs["max_tokens"] + draw(st.integers(1, 3))
    elif broken not in ("max_tokens", "min_tokens") and kwargs.get("min_tokens", 0) > kwargs.get("max_tokens", 16):
        kwargs["min_tokens"] = kwargs["max_tokens"]  # inside values that happen to cross: not the violation drawn
    return prompt, kwargs, priority, broken is None


@pytest.fixture(scope="module")
def engine(tiny_loaded: Any) -> Iterator[LLMEngine]:
    yield make_engine(tiny_loaded, max_model_len=MAX_MODEL_LEN, max_num_seqs=64)


def _submit(engine: LLMEngine, specs: list[tuple[Any, dict[str, Any], int, bool]]) -> dict[str, dict[str, Any]]:
    """Add each request; the accepted ones' ids and kwargs. Checks each was refused exactly when out of limits."""
    accepted = {}
    for prompt, kwargs, priority, ok in specs:
        before = set(engine.core.sampled.groups)
        try:
            rid = engine.add_request(prompt, SamplingParams(**kwargs), priority=priority)
        except RequestRejectedError:
            assert not ok, f"refused although inside every limit: {prompt!r} {kwargs!r} priority={priority!r}"
            assert set(engine.core.sampled.groups) == before  # refused alone: nothing queued, nobody else touched
            continue
        assert ok, f"accepted although outside a limit: {prompt!r} {kwargs!r} priority={priority!r}"
        accepted[rid] = kwargs
    return accepted


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(requests(), min_size=1, max_size=12))
def test_no_request_can_fail_a_step(engine: LLMEngine, batch: list[tuple[Any, dict[str, Any], int, bool]]) -> None:
    half = len(batch) // 2
    accepted, later = _submit(engine, batch[:half]), batch[half:]
    finals = {}
    for step in range(400):
        if later and (step == 1 or not engine.has_unfinished_requests()):
            # A second wave joins requests already running, so one step mixes prefills and decodes.
            accepted |= _submit(engine, later)
            later = []
        if not engine.has_unfinished_requests():
            break
        outputs = engine.step()  # must never raise
        assert engine.failed == {}
        finals.update({o.request_id: o for o in outputs if o.finished})
    else:
        raise AssertionError(f"requests still unfinished: {sorted(engine.core.sampled.groups)}")
    for rid, kwargs in accepted.items():
        out = finals[rid]
        assert out.error is None and len(out.outputs) == kwargs.get("n", 1)
        for seq in out.outputs:
            assert 1 <= len(seq.token_ids) <= kwargs.get("max_tokens", 16)
            assert seq.finish_reason in ("stop", "length")
    assert not engine.core.sampled.groups and not engine.core.scheduler.requests and all_blocks_free(engine)
