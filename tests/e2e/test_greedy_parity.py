"""Greedy output equals transformers' own ``generate`` token for token (fp32, embedded SmolLM2).

One set of 32 mixed-length prompts is checked all together on every model path and CPU graph mode
(``conftest.VARIANTS``), and on the fused path with chunked prefill forced by a tiny token budget, with
prefix-cache hits, and with preemption forced by a tiny KV budget. Those three change only which rows a
step holds, and a model path is a pure function of the step's batch, so the embedded model runs them on
one path (its 30 layers cost CI a minute per path); the tiny models run them on every path
(``test_tiny_architectures.py``). The reference backend checks a single long generation.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from paged_core import LLM, LLMEngine
from paged_core.reference.backend import ReferenceBackend

from .conftest import VARIANTS
from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy

pytestmark = pytest.mark.usefixtures("exact_activations")  # parity with transformers: exact fp32 activations


def test_single_prompt_matches_transformers_on_the_reference_backend(smol_base: LLM) -> None:
    # smol_base's weights on the reference backend: loading the GGUF again took longer than the generation.
    loaded = replace(smol_base.engine.loaded, backend=ReferenceBackend(device="cpu"), decoders={})
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(smol_base.engine.config.replace(backend="reference", kv_cache_memory="16MiB"), loaded)
    assert llm.engine.core.runner.backend.name == "reference"
    prompt = llm.apply_chat_template([{"role": "user", "content": "Name three rivers in Europe."}])
    params = replace(GREEDY, max_tokens=24)
    ours = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert ours == hf_greedy(smol_base, [prompt], 24)[0]


def test_32_mixed_prompts_together(smol: LLM, prompts32: list[list[int]], hf32: list[list[int]]) -> None:
    outs = smol.generate(prompts32, GREEDY, use_tqdm=False)
    assert_same_tokens(outs, hf32)


@pytest.fixture(scope="module")
def fused(smol_base: LLM) -> LLM:
    """The embedded model on the fused path, eager (what ``auto`` picks for it)."""
    llm = smol_base.reconfigured(**VARIANTS["fused-eager"])
    assert llm.engine.core.runner.forward_impl.name == "fused"
    return llm


def test_chunked_prefill_with_a_small_token_budget(
    fused: LLM, prompts32: list[list[int]], hf32: list[list[int]]
) -> None:
    llm = fused.reconfigured(max_num_batched_tokens=48, max_num_seqs=8)
    outs = llm.generate(prompts32, GREEDY, use_tqdm=False)
    assert_same_tokens(outs, hf32)


def test_prefix_cache_hits(fused: LLM, prompts32: list[list[int]], hf32: list[list[int]]) -> None:
    llm = fused.reconfigured()
    # Every prompt shares a 64-token prefix with the one before it; the second pass hits whole prompts.
    first = llm.generate(prompts32, GREEDY, use_tqdm=False)
    second = llm.generate(prompts32, GREEDY, use_tqdm=False)
    assert_same_tokens(first, hf32)
    assert_same_tokens(second, hf32)
    cached = sum(o.metrics.num_cached_tokens for o in second)
    assert cached >= sum(len(p) // 16 * 16 for p in prompts32) * 0.9, cached


def test_preemption_with_a_tiny_kv_budget(fused: LLM, prompts32: list[list[int]], hf32: list[list[int]]) -> None:
    # Room for about 1,000 tokens: the 32 prompts (~5,000 tokens) cannot all run, so requests are preempted.
    per_block = 30 * 2 * 3 * 64 * 4 * 16
    llm = fused.reconfigured(kv_cache_memory=per_block * 64, max_num_batched_tokens=512)
    outs = llm.generate(prompts32, GREEDY, use_tqdm=False)
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert_same_tokens(outs, hf32)
