"""Greedy parity with transformers on tiny random-weight mixture-of-experts models (fp32).

Qwen3-MoE (eight experts, two per token, renormalised, its middle layer dense) and Mixtral (four experts, two per
token), under the battery of test_tiny_architectures.py: one prompt, 32 mixed prompts together, chunked prefill,
prefix-cache hits and preemption, on the fast backend. Both model paths: the fused decoder (routed experts
through the backend's ``moe``) and transformers' modules (their experts modules through the contract's
arithmetic, :mod:`paged_core.runner.experts`), against transformers' own ``generate``, token for token.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from paged_core import LLM
from paged_core.runner import experts as experts_module
from paged_core.runner.fused import FusedDecoder

from .conftest import VARIANTS, fast_backend
from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .tiny_models import MOE, VOCAB, save_tiny_model

PARAMS = replace(GREEDY, max_tokens=24)
CASES = [f"{arch}-{variant}" for arch in sorted(MOE) for variant in ("fused-eager", "transformers-eager")]
MOE_LAYERS = {"qwen3_moe": [True, False, True], "mixtral": [True, True]}
"""Which layers route their MLP through experts (Qwen3-MoE's middle one is in mlp_only_layers)."""
_BASES: dict[str, tuple[LLM, list, list]] = {}


def _base(arch: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list, list]:
    """One engine, prompts and transformers' answers per architecture, shared by its variants."""
    if arch not in _BASES:
        path = save_tiny_model(arch, Path(tmp_path_factory.mktemp("models")))
        # 4 MiB a layer, as the two-layer models of test_tiny_architectures.py: the 32 prompts' blocks all fit, so a
        # second pass hits the prefix cache.
        llm = LLM(str(path), dtype="float32", kv_cache_memory=f"{4 * MOE[arch]().num_hidden_layers}MiB")
        rng = random.Random(1)
        prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 200))] for _ in range(32)]
        _BASES[arch] = (llm, prompts, hf_greedy(llm, prompts, PARAMS.max_tokens, attn="eager"))
    return _BASES[arch]


@pytest.fixture(scope="module", params=CASES)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, list, list]:
    arch, variant = request.param.split("-", 1)
    base, prompts, want = _base(arch, tmp_path_factory)
    llm = base.reconfigured(**VARIANTS[variant])
    forward = llm.engine.core.runner.forward_impl
    assert forward.name == VARIANTS[variant]["model_impl"]
    assert llm.engine.loaded.backend.name == fast_backend()
    if isinstance(forward, FusedDecoder):
        assert [layer.moe is not None for layer in forward.layers] == MOE_LAYERS[arch]
    else:
        routed = forward.experts.routed  # type: ignore[attr-defined]
        assert len(routed) == sum(MOE_LAYERS[arch]) and not forward.experts.kept  # type: ignore[attr-defined]
    return llm, prompts, want


def test_auto_takes_the_fused_decoder(tmp_path_factory: pytest.TempPathFactory) -> None:
    for arch in sorted(MOE):
        base, _, _ = _base(arch, tmp_path_factory)
        assert base.engine.core.runner.forward_impl.name == "fused", arch


def test_single_prompt(tiny: tuple[LLM, list, list]) -> None:
    llm, prompts, want = tiny
    assert_same_tokens(llm.generate([prompts[5]], PARAMS, use_tqdm=False), [want[5]])


def test_32_prompts_together(tiny: tuple[LLM, list, list], monkeypatch: pytest.MonkeyPatch) -> None:
    llm, prompts, want = tiny
    calls: list[object] = []
    step_ops = experts_module.step_ops

    def counted() -> object:
        ops = step_ops()
        calls.append(ops)
        return ops

    monkeypatch.setattr(experts_module, "step_ops", counted)
    assert_same_tokens(llm.generate(prompts, PARAMS, use_tqdm=False), want)
    # The transformers path's experts modules run the backend's experts op inside steps (the forward's ops); the
    # fused decoder calls its moe and never enters an experts module.
    forward = llm.engine.core.runner.forward_impl
    if forward.name == "transformers":
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
    layers = len(llm.engine.loaded.specs)
    per_block = layers * 2 * 2 * 64 * 4 * llm.engine.core.runner.block_size
    tight = llm.reconfigured(kv_cache_memory=per_block * 24, max_num_batched_tokens=256)
    outs = tight.generate(prompts, PARAMS, use_tqdm=False)
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert_same_tokens(outs, want)
