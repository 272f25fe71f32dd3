"""Sliding-window layers that free their blocks: a model whose every layer slides runs in a cache far smaller
than its sequences, and matches transformers token for token.

The tiny Mistral slides over 16 tokens on every layer: at any step a request holds at most three blocks of
16 (the window's two and the one being written), so 10 blocks serve 340 tokens and more. Hybrid models
(Gemma2, Gemma3) run the parity battery in test_tiny_architectures.py.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from paged_core import LLM

from .conftest import fast_backend
from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .tiny_models import VOCAB, save_tiny_model


@pytest.fixture(scope="module")
def mistral16(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = save_tiny_model("mistral16", Path(tmp_path_factory.mktemp("models")))
    # 11 blocks: the null block and 10 of 16 tokens, 160 token slots in all.
    return LLM(str(path), dtype="float32", num_blocks=11, block_size=16)


def test_300_tokens_after_a_40_token_prompt_in_10_blocks(mistral16: LLM) -> None:
    llm = mistral16
    assert llm.engine.loaded.backend.name == fast_backend()
    assert all(s.sliding_window == 16 for s in llm.engine.loaded.specs)
    sched = llm.engine.core.scheduler
    # The context limit is the model's, not the cache's 160 slots.
    assert sched.max_len == 1024
    prompt = [random.Random(3).randrange(3, VOCAB) for _ in range(40)]
    want = hf_greedy(llm, [prompt], 300, attn="eager")
    held: list[int] = []
    pool = sched.kv.pool
    step = llm.engine.core.step

    def counting_step():  # type: ignore[no-untyped-def]
        out = step()
        held.append(pool.num_usable_blocks - pool.num_free_blocks)
        return out

    llm.engine.core.step = counting_step  # type: ignore[method-assign]
    try:
        outs = llm.generate([prompt], replace(GREEDY, max_tokens=300), use_tqdm=False)
    finally:
        del llm.engine.core.step
    assert_same_tokens(outs, want)
    assert len(outs[0].outputs[0].token_ids) == 300
    assert sched.num_preemptions == 0
    assert max(held) <= 3, f"the request held up to {max(held)} blocks; its window needs 3"


def test_prompts_longer_than_the_cache_prefill_in_chunks_that_fit(mistral16: LLM) -> None:
    # 400-token prompts in 160 slots: each chunk's blocks (the window behind it and the chunk itself) must fit.
    rng = random.Random(4)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(400)] for _ in range(2)]
    want = hf_greedy(mistral16, prompts, 24, attn="eager")
    assert_same_tokens(mistral16.generate(prompts, replace(GREEDY, max_tokens=24), use_tqdm=False), want)
