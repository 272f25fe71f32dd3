"""Speculative decoding end to end: greedy output equals decoding without drafts, token for token, with
either proposer (n-gram lookup, a draft model), through preemption and prefix-cache hits; sampled
outputs follow the same distribution with and without drafts (two-sample chi-squared on a tiny model)."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from paged_core import LLM, SamplingParams
from paged_core.api import ConfigError

from .e2e_helpers import GREEDY, assert_same_tokens
from .tiny_models import VOCAB, save_tiny_model

pytestmark = pytest.mark.usefixtures("exact_activations")  # parity with transformers: exact fp32 activations


def _tiny_draft_for(llm: LLM, directory: Path) -> Path:
    """A 2-layer random Llama with the embedded model's tokenizer and vocabulary (a poor but valid draft)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = llm.engine.loaded.model.config
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
    )
    out = directory / "tiny-draft"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    llm.tokenizer.save_pretrained(out)
    return out


def test_ngram_greedy_equals_transformers_through_preemption_and_prefix_hits(
    smol_base: LLM, prompts32: list[list[int]], hf32: list[list[int]]
) -> None:
    per_block = 30 * 2 * 3 * 64 * 4 * 16
    llm = smol_base.reconfigured(
        speculative="ngram", num_speculative_tokens=4, kv_cache_memory=per_block * 64, max_num_batched_tokens=512
    )
    first = llm.generate(prompts32, GREEDY, use_tqdm=False)
    second = llm.generate(prompts32, GREEDY, use_tqdm=False)
    assert_same_tokens(first, hf32)
    assert_same_tokens(second, hf32)
    core = llm.engine.core
    stats = core.spec_stats
    assert core.scheduler.num_preemptions > 0
    assert sum(o.metrics.num_cached_tokens for o in second) > 0
    assert stats.verify_rows > 0 and 0 < stats.accepted_tokens < stats.draft_tokens, stats
    # Opted out: no drafts for it.
    before = stats.draft_tokens
    llm.generate(
        prompts32[:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, speculate=False), use_tqdm=False
    )
    assert stats.draft_tokens == before


def test_draft_model_greedy_equals_transformers_through_preemption_and_prefix_hits(
    smol_base: LLM, prompts32: list[list[int]], hf32: list[list[int]], tmp_path: Path
) -> None:
    draft = _tiny_draft_for(smol_base, tmp_path)
    # Room for about 600 tokens (the draft's KV is paid from the same budget): 12 prompts must preempt.
    per_block = 30 * 2 * 3 * 64 * 4 * 16
    small = smol_base.reconfigured(
        speculative=str(draft), num_speculative_tokens=3, kv_cache_memory=per_block * 40, max_num_batched_tokens=512
    )
    assert_same_tokens(small.generate(prompts32[:12], GREEDY, use_tqdm=False), hf32[:12])
    assert small.engine.core.scheduler.num_preemptions > 0
    assert small.engine.core.scheduler.config.num_lookahead_tokens == 3
    # Roomy: the second pass finds its prompts in the prefix cache.
    roomy = smol_base.reconfigured(speculative=str(draft), num_speculative_tokens=3)
    first = roomy.generate(prompts32[:6], GREEDY, use_tqdm=False)
    second = roomy.generate(prompts32[:6], GREEDY, use_tqdm=False)
    assert_same_tokens(first, hf32[:6])
    assert_same_tokens(second, hf32[:6])
    assert sum(o.metrics.num_cached_tokens for o in second) > 0
    for core in (small.engine.core, roomy.engine.core):
        assert core.spec_stats.verify_rows > 0 and core.spec_stats.draft_tokens > 0, core.spec_stats


def test_a_draft_of_another_vocabulary_is_refused(smol_base: LLM, tmp_path: Path) -> None:
    other = save_tiny_model("qwen3", tmp_path)
    with pytest.raises(ConfigError, match="vocabulary has 512 entries"):
        smol_base.reconfigured(speculative=str(other))
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        smol_base.reconfigured(speculative="ngram", num_speculative_tokens=0)
    with pytest.raises(ConfigError, match="does not fit a context of 16 tokens; use at most 15"):
        smol_base.reconfigured(speculative="ngram", num_speculative_tokens=20, max_model_len=16)


# ---- sampled: the same distribution with and without drafts ---------------------------------------------


def _homogeneity(a: Counter[int], b: Counter[int]) -> tuple[float, int]:
    """Two-sample chi-squared statistic and degrees of freedom; categories expected below 5 are pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cats, other = [], [0, 0]
    for tok in set(a) | set(b):
        if (a[tok] + b[tok]) * min(na, nb) / (na + nb) >= 5:
            cats.append((a[tok], b[tok]))
        else:
            other[0] += a[tok]
            other[1] += b[tok]
    if sum(other):
        cats.append((other[0], other[1]))
    stat = 0.0
    for ca, cb in cats:
        total = ca + cb
        ea, eb = total * na / (na + nb), total * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    return stat, len(cats) - 1


def _bound(df: int, z: float = 4.0) -> float:
    """Wilson-Hilferty upper chi-squared quantile (z = 4: a false alarm about once in 30,000 runs)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, Path]:
    root = Path(tmp_path_factory.mktemp("spec-tiny"))
    target = save_tiny_model("qwen3", root / "target", seed=0)
    draft = save_tiny_model("qwen3", root / "draft", seed=1)
    return LLM(str(target), dtype="float32", kv_cache_memory="8MiB"), draft


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_sampled_outputs_follow_the_same_distribution_with_and_without_drafts(
    tiny_pair: tuple[LLM, Path], proposer: str
) -> None:
    base, draft = tiny_pair
    rng = random.Random(0)
    motif = [rng.randrange(3, VOCAB) for _ in range(6)]
    prompt = motif * 5  # repeats, so the n-gram proposer has something to propose
    params = SamplingParams(temperature=1.0, top_k=20, max_tokens=6, ignore_eos=True)
    samples = 600
    spec = base.reconfigured(speculative="ngram" if proposer == "ngram" else str(draft), num_speculative_tokens=3)
    without = [o.outputs[0].token_ids for o in base.generate([prompt] * samples, params, use_tqdm=False)]
    with_drafts = [o.outputs[0].token_ids for o in spec.generate([prompt] * samples, params, use_tqdm=False)]
    stats = spec.engine.core.spec_stats
    assert stats.accepted_tokens > 0 and stats.accepted_tokens < stats.draft_tokens, stats
    for pos in range(1, 6):
        stat, df = _homogeneity(Counter(t[pos] for t in without), Counter(t[pos] for t in with_drafts))
        assert df >= 1 and stat < _bound(df), (pos, stat, df)
