"""Structured outputs in the core, on the tiny byte-level engine: every output fits its constraint.

The tiny model is random, so only the grammar's mask makes its text fit: a regex output must fullmatch, a choice
be one of the choices. Compiles wait outside the scheduler; a failed one ends its request alone.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from paged_core.frontend.llm_engine import LLMEngine
from paged_core.frontend.outputs import RequestOutput
from paged_core.sampling.params import SamplingParams
from paged_core.structured import StructuredOutputs

from ..engine_helpers import all_blocks_free, make_engine, run_to_end

REGEX = r"[a-c]{2,5}-(x|yz)"
CHOICES = ["red", "green", "blue"]


def _params(**kw: Any) -> SamplingParams:
    fields: dict[str, Any] = {"max_tokens": 16, "temperature": 1.0, "seed": 7}
    fields.update(kw)
    return SamplingParams(**fields)


def _run(engine: LLMEngine, requests: dict[str, SamplingParams], prompt: str = "hi") -> dict[str, RequestOutput]:
    for rid, params in requests.items():
        engine.add_request(prompt, params, request_id=rid)
    return run_to_end(engine)


@pytest.fixture(scope="module")
def engine(tiny_loaded: Any) -> LLMEngine:
    """One engine for the module (its grammar compiler is built once)."""
    return make_engine(tiny_loaded)


def test_regex_and_choice_outputs_fit_and_stop(engine: LLMEngine) -> None:
    out = _run(
        engine,
        {
            "re-sampled": _params(structured_outputs=StructuredOutputs(regex=REGEX)),
            "re-greedy": _params(temperature=0.0, structured_outputs=StructuredOutputs(regex=REGEX)),
            "choice": _params(structured_outputs=StructuredOutputs(choice=CHOICES)),
            "free": _params(),
        },
    )
    for rid in ("re-sampled", "re-greedy"):
        comp = out[rid].outputs[0]
        assert re.fullmatch(REGEX, comp.text), (rid, comp.text)
        assert comp.finish_reason == "stop"
    assert out["choice"].outputs[0].text in CHOICES
    assert out["choice"].outputs[0].finish_reason == "stop"
    assert out["free"].outputs[0].finish_reason is not None
    assert all_blocks_free(engine)
    stats = engine.core.grammars.stats
    # The two regex requests share one compile (or the cache's, from an earlier test on this engine).
    assert 1 <= len(stats.compile_s) and stats.steps > 0 and stats.rows >= stats.steps


def test_compile_error_fails_alone_while_another_completes(engine: LLMEngine) -> None:
    engine.add_request("hi", _params(structured_outputs=StructuredOutputs(regex="a(b")), request_id="bad")
    engine.add_request("hi", _params(structured_outputs=StructuredOutputs(choice=CHOICES)), request_id="good")
    errors: dict[str, str | None] = {}
    final: dict[str, RequestOutput] = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
                errors[o.request_id] = o.error
    assert set(final) == {"bad", "good"}
    assert final["good"].outputs[0].text in CHOICES
    bad_error = errors["bad"]
    assert bad_error is not None and "structured_outputs.regex" in bad_error
    assert all_blocks_free(engine)


def test_n2_siblings_each_fit(engine: LLMEngine) -> None:
    out = _run(engine, {"n2": _params(n=2, seed=3, structured_outputs=StructuredOutputs(regex=REGEX))})
    texts = [c.text for c in out["n2"].outputs]
    assert len(texts) == 2
    assert all(re.fullmatch(REGEX, t) for t in texts), texts


def test_max_tokens_cut_ends_with_length_and_a_valid_prefix(engine: LLMEngine) -> None:
    spec = StructuredOutputs(regex=r"[ab]{20}")
    out = _run(engine, {"cut": _params(max_tokens=6, structured_outputs=spec)})
    comp = out["cut"].outputs[0]
    assert comp.finish_reason == "length"
    assert re.fullmatch(r"[ab]{6}", comp.text), comp.text


def test_preempted_constrained_requests_still_fit(tiny_loaded: Any) -> None:
    # 6 usable blocks of 16 tokens (8 KiB each, plus the null block): 8 requests of ~40 tokens preempt one another.
    small = make_engine(tiny_loaded, kv_cache_memory=7 * 8192, max_model_len=48)
    long_regex = r"[a-z]{30,34}\."
    requests = {
        f"p{i}": _params(seed=i, max_tokens=40, structured_outputs=StructuredOutputs(regex=long_regex))
        for i in range(8)
    }
    out = _run(small, requests)
    assert small.core.scheduler.num_preemptions > 0
    for rid in requests:
        comp = out[rid].outputs[0]
        assert re.fullmatch(long_regex, comp.text), (rid, comp.text)
    assert all_blocks_free(small)


def test_masks_go_through_the_backends_hook(engine: LLMEngine) -> None:
    apply = engine.core.grammars._apply
    ops_class = type(engine.core.loaded.backend.fused_ops())
    assert getattr(apply, "__func__", None) is ops_class.apply_token_bitmask


def test_drafts_are_checked_against_the_grammar(tiny_loaded: Any) -> None:
    # A repetitive regex gives the n-gram proposer drafts; greedy output must equal the undrafted one and fit.
    spec = StructuredOutputs(regex=r"(ab|abc){4,8}!")
    params = {f"g{i}": _params(temperature=0.0, max_tokens=30, structured_outputs=spec) for i in range(3)}
    plain = _run(make_engine(tiny_loaded), params, prompt="abcabcab")
    drafted_engine = make_engine(tiny_loaded, speculative="ngram", num_speculative_tokens=3)
    drafted = _run(drafted_engine, params, prompt="abcabcab")
    assert drafted_engine.core.spec_stats.verify_rows > 0
    for rid in params:
        assert drafted[rid].outputs[0].token_ids == plain[rid].outputs[0].token_ids
        assert re.fullmatch(r"(ab|abc){4,8}!", drafted[rid].outputs[0].text)


def test_a_compile_in_flight_never_holds_the_step_loop(tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A constraint whose compile is held (a pathological grammar) waits alone: a free request runs to its end while
    it waits, then the held one compiles and completes."""
    import threading

    engine = make_engine(tiny_loaded)
    compiler = engine.core.grammars.compiler
    release = threading.Event()
    real = compiler._compile

    def held(spec: StructuredOutputs) -> Any:
        assert release.wait(60)
        return real(spec)

    monkeypatch.setattr(compiler, "_compile", held)
    engine.add_request("hi", _params(structured_outputs=StructuredOutputs(regex=REGEX)), request_id="held")
    engine.add_request("hi", _params(max_tokens=8), request_id="free")
    free: RequestOutput | None = None
    for _ in range(50):
        free = next((o for o in engine.step() if o.request_id == "free" and o.finished), free)
        if free is not None:
            break
    assert free is not None and len(free.outputs[0].token_ids) == 8
    assert engine.core.grammars.pending == 1 and engine.has_unfinished_requests()
    release.set()
    out = run_to_end(engine)
    assert re.fullmatch(REGEX, out["held"].outputs[0].text)
    assert all_blocks_free(engine)
