"""Greedy parity with transformers on tiny random-weight models of other architectures.

Qwen3 (q/k norms), Mistral (sliding window), Gemma2 (soft cap, explicit attention scale,
alternating sliding layers: two KV-cache groups), Gemma3 (two sliding layers to one full: three
groups, sliding ones freeing their blocks) and the mixtures of experts Qwen3-MoE (eight experts, two per token,
renormalised, its middle layer dense) and Mixtral (four experts, two per token), each under the same battery as
the embedded model: 32 mixed prompts together, chunked prefill, prefix-cache hits and preemption, on the fast
backend (cpu where installed); Qwen3 and Mistral on every model path and CPU graph mode, the Gemmas and the MoE
models on both model paths, eagerly (several KV-cache groups run eagerly). The MoE models' routed experts go
through the backend's ops on both paths: ``moe`` in the fused decoder, ``experts`` from transformers' experts
modules (:mod:`paged_core.runner.experts`).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from paged_core import LLM
from paged_core.api import UnsupportedConfigError
from paged_core.runner import experts as experts_module
from paged_core.runner.fused import FusedDecoder, GemmaDecoder

from .conftest import VARIANTS, fast_backend
from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .tiny_models import ARCHITECTURES, MOE, VOCAB, save_tiny_model

PARAMS = replace(GREEDY, max_tokens=24)
HYBRID = {"gemma2", "gemma3"}
"""Architectures with several KV-cache groups: they run eagerly (``compiled`` is refused, see below)."""
CASES = [
    f"{arch}-{variant}"
    for arch in sorted(ARCHITECTURES)
    for variant in VARIANTS
    if arch not in HYBRID or VARIANTS[variant]["graph_mode"] == "eager"
] + [f"{arch}-{variant}" for arch in sorted(MOE) for variant in ("fused-eager", "transformers-eager")]
KV_GROUPS = {"qwen3": 1, "mistral": 1, "gemma2": 2, "gemma3": 3, "qwen3_moe": 1, "mixtral": 1}
"""KV-cache groups: Gemma2 alternates sliding and full layers (two groups of one), Gemma3 slides on two of three."""
MOE_LAYERS = {"qwen3_moe": [True, False, True], "mixtral": [True, True]}
"""Which layers route their MLP through experts (Qwen3-MoE's middle one is in mlp_only_layers)."""
_BASES: dict[str, tuple[LLM, list, list]] = {}


def _base(arch: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list, list]:
    """One engine, prompts and transformers' answers per architecture, shared by its variants."""
    if arch not in _BASES:
        path = save_tiny_model(arch, Path(tmp_path_factory.mktemp("models")))
        # 4 MiB a layer for the MoE models (Qwen3-MoE has three), as 8 MiB for the two-layer ones: the 32 prompts'
        # blocks all fit, so a second pass hits the prefix cache.
        memory = f"{4 * MOE[arch]().num_hidden_layers}MiB" if arch in MOE else "8MiB"
        llm = LLM(str(path), dtype="float32", kv_cache_memory=memory)
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
    if arch in MOE and isinstance(impl, FusedDecoder):
        assert [layer.moe is not None for layer in impl.layers] == MOE_LAYERS[arch]
    elif arch in MOE:
        routed = impl.experts.routed  # type: ignore[attr-defined]
        assert len(routed) == sum(MOE_LAYERS[arch]) and not impl.experts.kept  # type: ignore[attr-defined]
    # Sliding windows and soft caps run on the fast backend, not the reference one.
    assert llm.engine.loaded.backend.name == fast_backend()
    assert llm.engine.core.scheduler.kv.num_groups == KV_GROUPS[arch]
    return llm, prompts, want


def test_auto_takes_the_fused_decoder_for_moe_models(tmp_path_factory: pytest.TempPathFactory) -> None:
    for arch in sorted(MOE):
        base, _, _ = _base(arch, tmp_path_factory)
        assert base.engine.core.runner.forward_impl.name == "fused", arch


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


def test_32_prompts_together(tiny: tuple[LLM, list, list], monkeypatch: pytest.MonkeyPatch) -> None:
    llm, prompts, want = tiny
    calls: list[object] = []
    step_ops = experts_module.step_ops

    def counted() -> object:
        calls.append(step_ops())
        return calls[-1]

    monkeypatch.setattr(experts_module, "step_ops", counted)
    assert_same_tokens(llm.generate(prompts, PARAMS, use_tqdm=False), want)
    # transformers' experts modules run the backend's experts op inside steps (the forward's ops); the fused decoder
    # calls its moe and never enters an experts module (nor does a dense model).
    forward = llm.engine.core.runner.forward_impl
    if forward.name == "transformers" and forward.experts.routed:  # type: ignore[attr-defined]
        assert calls and all(ops is forward.ops for ops in calls)  # type: ignore[attr-defined]
    else:
        assert calls == []


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
    moe = llm.engine.config.model.model is not None and any(arch in llm.engine.config.model.model for arch in MOE)
    layers = len(llm.engine.loaded.specs) if moe else 2  # a block's bytes over the MoE models' layers
    per_block = layers * 2 * 2 * 64 * 4 * llm.engine.core.runner.block_size
    tight = llm.reconfigured(kv_cache_memory=per_block * 24, max_num_batched_tokens=256)
    outs = tight.generate(prompts, PARAMS, use_tqdm=False)
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert_same_tokens(outs, want)
