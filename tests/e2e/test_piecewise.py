"""Piecewise capture end to end: greedy output equals transformers' with the steps whole-step graphs cannot hold
run as the decoder's pieces, under chunked prefill, preemption, prefix-cache hits and speculative decoding.

Device pieces run through the recording stand-in (a reference backend declaring uniform-decode capture, whose
strategy replays by calling the captured piece again on its static buffers): padding to a piece size, the
static buffers, eager attention between pieces with the real metadata and the dispatch are all the core's.
Compiled pieces (``graph_mode='compiled'`` on the cpu backend, which captures nothing) run the tiny
architectures' battery in test_tiny_architectures.py; here they run speculative decoding.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

from paged_core import LLMEngine
from paged_core.api import UnsupportedConfigError
from paged_core.frontend.llm import LLM
from paged_core.runner.compiled_executor import CompiledExecutor
from paged_core.runner.device_executor import DeviceGraphExecutor

from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .graph_doubles import CapturingReference, RecordingStrategy
from .tiny_models import VOCAB, save_tiny_model

PARAMS = dataclasses.replace(GREEDY, max_tokens=16)
SIZES = (1, 2, 4, 8, 16, 32, 64)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list[list[int]], list[list[int]]]:
    path = save_tiny_model("qwen3", Path(tmp_path_factory.mktemp("models")))
    llm = LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB")
    rng = random.Random(11)
    # Repeated phrases give the n-gram proposer drafts to verify.
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 24))] * rng.randint(1, 4) for _ in range(10)]
    return llm, prompts, hf_greedy(llm, prompts, PARAMS.max_tokens, attn="eager")


def _pieces_llm(base: LLM, strategy: RecordingStrategy, **overrides: object) -> LLM:
    """``base``'s weights on a backend capturing uniform decode with ``strategy``, device graphs plus pieces."""
    loaded = dataclasses.replace(base.engine.loaded, backend=CapturingReference(strategy))
    config = base.engine.config.replace(
        graph_mode="device", model_impl="fused", capture_sizes=SIZES, piecewise=True, **overrides
    )
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(config, loaded)
    return llm


@pytest.mark.parametrize(
    "case",
    ["together", "chunked-prefill", "preemption", "prefix-hits", "speculative"],
)
def test_device_pieces_match_transformers(case: str, base: tuple[LLM, list[list[int]], list[list[int]]]) -> None:
    llm0, prompts, want = base
    overrides: dict[str, object] = {"max_num_batched_tokens": 64}  # every step fits the largest piece size
    if case == "chunked-prefill":
        overrides.update(max_num_batched_tokens=24, max_num_seqs=4)
    if case == "preemption":
        overrides.update(kv_cache_memory=2 * 2 * 2 * 64 * 4 * 16 * 12)  # 12 blocks for 10 prompts
    if case == "speculative":
        overrides.update(speculative="ngram", num_speculative_tokens=3)
    strategy = RecordingStrategy()
    llm = _pieces_llm(llm0, strategy, **overrides)
    executor = llm.engine.core.runner.executor
    assert isinstance(executor, DeviceGraphExecutor) and executor.pieces is not None
    layers = len(llm.engine.loaded.specs)
    # Whole-step graphs (sizes up to the row budget) and pieces (one per layer, plus the last) for every size.
    assert executor.pieces.sizes == list(SIZES)
    assert executor.graphs.sizes == [s for s in SIZES if s <= llm.engine.config.scheduler.max_num_seqs]
    captures = len(executor.graphs.sizes) + len(SIZES) * (layers + 1)
    assert strategy.calls == Counter(capture=captures), strategy.calls  # at start
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    if case == "prefix-hits":
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        assert sum(o.metrics.num_cached_tokens for o in outs) > 0
    assert_same_tokens(outs, want)
    stats, core = executor.stats, llm.engine.core
    assert stats.piece_replays > 0 and stats.replays > stats.piece_replays, stats  # pieces and whole decodes
    assert stats.eager_steps == 0 and not stats.fallback_reasons, stats  # nothing left to run eagerly
    assert sum(executor.pieces.replays_by_size.values()) == stats.piece_replays
    if case == "preemption":
        assert core.scheduler.num_preemptions > 0
    if case == "speculative":
        assert core.spec_stats.draft_tokens > 0 and core.spec_stats.accepted_tokens > 0, core.spec_stats
    assert core.stats().graph_piece_replays == stats.piece_replays


def test_steps_above_the_largest_piece_size_run_eagerly_counted(
    base: tuple[LLM, list[list[int]], list[list[int]]],
) -> None:
    llm0, prompts, want = base
    llm = _pieces_llm(llm0, RecordingStrategy(), max_num_batched_tokens=256)
    assert_same_tokens(llm.generate(prompts, PARAMS, use_tqdm=False), want)
    stats = llm.engine.core.runner.executor.stats
    assert stats.fallback_reasons["more tokens than the largest piecewise size"] == stats.eager_steps > 0, stats


@pytest.mark.parametrize("fail_on", ["capture", "replay"])
def test_a_strategy_failing_on_pieces_turns_them_eager_and_fails_no_request(
    fail_on: str, base: tuple[LLM, list[list[int]], list[list[int]]]
) -> None:
    llm0, prompts, want = base
    llm = _pieces_llm(llm0, RecordingStrategy(fail_on=fail_on), max_num_batched_tokens=64)
    assert_same_tokens(llm.generate(prompts, PARAMS, use_tqdm=False), want)
    stats = llm.engine.core.runner.executor.stats
    assert stats.replays == 0 and stats.eager_steps == stats.steps
    assert stats.fallback_reasons[f"graph strategy {fail_on} raised RuntimeError"] > 0, stats


def test_piecewise_is_refused_where_it_cannot_run(base: tuple[LLM, list[list[int]], list[list[int]]]) -> None:
    llm0, _, _ = base
    with pytest.raises(UnsupportedConfigError, match="piecewise capture needs graph_mode compiled or device"):
        llm0.reconfigured(graph_mode="eager", piecewise=True)
    with pytest.raises(UnsupportedConfigError, match=r"piecewise=True refused: .*fused decoder"):
        llm0.reconfigured(graph_mode="compiled", model_impl="transformers", piecewise=True)


def test_compiled_pieces_verify_drafts_like_transformers(
    base: tuple[LLM, list[list[int]], list[list[int]]],
) -> None:
    llm0, prompts, want = base
    # The reference backend captures nothing, so compiled mode compiles its pieces (auto); aot_eager would do as
    # well, but the default compiler is what users run.
    llm = llm0.reconfigured(graph_mode="compiled", speculative="ngram", num_speculative_tokens=3)
    executor = llm.engine.core.runner.executor
    assert isinstance(executor, CompiledExecutor) and executor.pieces is not None
    assert_same_tokens(llm.generate(prompts, PARAMS, use_tqdm=False), want)
    assert executor.stats.piece_replays == executor.stats.steps > 0
    assert llm.engine.core.spec_stats.accepted_tokens > 0
