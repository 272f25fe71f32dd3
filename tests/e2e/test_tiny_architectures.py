"""Greedy parity with transformers on tiny random-weight models of other architectures.

Qwen3 (q/k norms), Mistral (sliding window), Gemma2 (soft cap, explicit attention scale,
alternating sliding layers: two KV-cache groups) and Gemma3 (two sliding layers to one full: three
groups, sliding ones freeing their blocks), each under the same battery as the embedded model: 32 mixed
prompts together, chunked prefill, prefix-cache hits and preemption, on the fast backend (cpu where
installed); Qwen3 and Mistral on every model path and CPU graph mode, the Gemmas on both model paths, eagerly
(several KV-cache groups run eagerly).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from paged_core import LLM
from paged_core.api import UnsupportedConfigError
from paged_core.runner.fused import GemmaDecoder

from .conftest import VARIANTS, fast_backend
from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .tiny_models import ARCHITECTURES, VOCAB, save_tiny_model

PARAMS = replace(GREEDY, max_tokens=24)
HYBRID = {"gemma2", "gemma3"}
"""Architectures with several KV-cache groups: they run eagerly (``compiled`` is refused, see below)."""
CASES = [
    f"{arch}-{variant}"
    for arch in sorted(ARCHITECTURES)
    for variant in VARIANTS
    if arch not in HYBRID or VARIANTS[variant]["graph_mode"] == "eager"
]
KV_GROUPS = {"qwen3": 1, "mistral": 1, "gemma2": 2, "gemma3": 3}
"""KV-cache groups: Gemma2 alternates sliding and full layers (two groups of one), Gemma3 slides on two of three."""
_BASES: dict[str, tuple[LLM, list, list]] = {}


def _base(arch: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list, list]:
    """One engine, prompts and transformers' answers per architecture, shared by its variants."""
    if arch not in _BASES:
        path = save_tiny_model(arch, Path(tmp_path_factory.mktemp("models")))
        llm = LLM(str(path), dtype="float32", kv_cache_memory="8MiB")
        rng = random.Random(1)
        prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 200))] for _ in range(32)]
        _BASES[arch] = (llm, prompts, hf_greedy(llm, prompts, PARAMS.max_tokens, attn="eager"))
    return _BASES[arch]


@pytest.fixture(scope="module", params=CASES)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list, list]:
    arch, variant = request.param.split("-", 1)
    base, prompts, want = _base(arch, tmp_path_factory)
    llm = base.reconfigured(**VARIANTS[variant])
    impl = llm.engine.core.runner.forward_impl
    assert impl.name == VARIANTS[variant]["model_impl"]
    if arch in HYBRID and impl.name == "fused":
        assert isinstance(impl, GemmaDecoder)
    # Sliding windows and soft caps run on the fast backend, not the reference one.
    assert llm.engine.loaded.backend.name == fast_backend()
    assert llm.engine.core.scheduler.kv.num_groups == KV_GROUPS[arch]
    return llm, prompts, want


def test_gemma2_runs_fused_by_default_and_refuses_compiled(tmp_path_factory: pytest.TempPathFactory) -> None:
    base, _, _ = _base("gemma2", tmp_path_factory)
    assert isinstance(base.engine.core.runner.forward_impl, GemmaDecoder)  # model_impl='auto'
    with pytest.raises(UnsupportedConfigError, match=r"compiled' refused: .* mixes attention kinds .* runs eagerly"):
        base.reconfigured(graph_mode="compiled")


def test_single_prompt(tiny: tuple[LLM, list, list]) -> None:
    llm, prompts, want = tiny
    specs = llm.engine.loaded.specs
    model = llm.engine.config.model.model
    if model and "mistral" in model:
        assert all(s.sliding_window == 48 for s in specs)  # read from the config: Mistral's modules lack it
    assert_same_tokens(llm.generate([prompts[5]], PARAMS, use_tqdm=False), [want[5]])


def test_32_prompts_together(tiny: tuple[LLM, list, list]) -> None:
    llm, prompts, want = tiny
    assert_same_tokens(llm.generate(prompts, PARAMS, use_tqdm=False), want)


def test_chunked_prefill(tiny: tuple[LLM, list, list]) -> None:
    llm, prompts, want = tiny
    small = llm.reconfigured(max_num_batched_tokens=40, max_num_seqs=6)
    assert_same_tokens(small.generate(prompts, PARAMS, use_tqdm=False), want)


def test_prefix_cache_hits(tiny: tuple[LLM, list, list]) -> None:
    llm, prompts, want = tiny
    fresh = llm.reconfigured()
    fresh.generate(prompts, PARAMS, use_tqdm=False)
    again = fresh.generate(prompts, PARAMS, use_tqdm=False)
    assert sum(o.metrics.num_cached_tokens for o in again) > 0
    assert_same_tokens(again, want)


def test_preemption(tiny: tuple[LLM, list, list]) -> None:
    llm, prompts, want = tiny
    per_block = 2 * 2 * 2 * 64 * 4 * llm.engine.core.runner.block_size
    tight = llm.reconfigured(kv_cache_memory=per_block * 24, max_num_batched_tokens=256)
    outs = tight.generate(prompts, PARAMS, use_tqdm=False)
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert_same_tokens(outs, want)
