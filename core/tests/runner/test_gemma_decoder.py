"""The fused decoder's Gemma2/Gemma3 path: which models it takes and refuses (by the reason), and its pieces
(norm arithmetic, scaled embedding, per-layer-type rotary, final soft cap) against transformers' modules
(tiny random models, fp32; the whole-model greedy battery is tests/e2e/test_tiny_architectures.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from paged_core.api import UnsupportedConfigError
from paged_core.reference.backend import ReferenceBackend
from paged_core.runner.attention import layer_specs
from paged_core.runner.forward import make_forward, model_path
from paged_core.runner.fused import FusedDecoder, GemmaDecoder, fused_refusal
from paged_core.runner.fused.gemma import gemma_weight

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "initializer_range": 0.3,
    "query_pre_attn_scalar": 24,
    "sliding_window": 8,
}


def gemma2(**extra: Any) -> Any:
    from transformers import AutoModelForCausalLM, Gemma2Config

    config = Gemma2Config(**{**SMALL, "num_hidden_layers": 2, "final_logit_softcapping": 3.0, **extra})
    torch.manual_seed(0)
    return _spread_norms(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval())


def gemma3(**extra: Any) -> Any:
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    types = ["sliding_attention", "sliding_attention", "full_attention"]
    fields = {"num_hidden_layers": 3, "layer_types": types, "rope_local_base_freq": 100.0}
    config = Gemma3TextConfig(**{**SMALL, **fields, **extra})
    torch.manual_seed(0)
    return _spread_norms(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval())


def _spread_norms(model: Any) -> Any:
    """Gemma norms start at zero (an effective weight of one): random ones make them matter."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.5)
    return model


def _decoder(model: Any) -> GemmaDecoder:
    forward = make_forward("auto", model, ReferenceBackend(), layer_specs(model), 64)
    assert isinstance(forward, GemmaDecoder)
    return forward


@pytest.mark.parametrize("build", [gemma2, gemma3])
def test_auto_picks_the_fused_gemma_decoder(build: Any) -> None:
    model = build()
    assert fused_refusal(model) is None
    assert model_path("auto", model) == "fused"
    decoder = _decoder(model)
    assert len(decoder.layers) == model.config.num_hidden_layers
    assert (decoder.layers[0].q_norm is not None) == (build is gemma3)  # Gemma3 normalises q and k


@pytest.mark.parametrize(
    ("build", "extra", "reason"),
    [
        (gemma2, {"hidden_activation": "gelu_new"}, "hidden_activation 'gelu_new'"),
        (gemma3, {"use_bidirectional_attention": True}, "use_bidirectional_attention is set"),
        (gemma3, {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
    ],
)
def test_refusals_name_the_reason(build: Any, extra: dict[str, Any], reason: str) -> None:
    model = build(**extra)
    refusal = fused_refusal(model)
    assert refusal is not None and reason in refusal
    assert model_path("auto", model) == "transformers"
    with pytest.raises(UnsupportedConfigError, match="model_impl='fused' refused"):
        make_forward("fused", model, ReferenceBackend(), layer_specs(model), 64)
    assert make_forward("auto", model, ReferenceBackend(), layer_specs(model), 64).name == "transformers"


def test_the_llama_family_decoder_refuses_gemma_and_the_gemma_one_refuses_llama() -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    model = gemma2()
    with pytest.raises(UnsupportedConfigError, match="Gemma layers run on GemmaDecoder"):
        FusedDecoder(model, ReferenceBackend(), layer_specs(model), 64)
    llama = AutoModelForCausalLM.from_config(LlamaConfig(**{**SMALL, "num_hidden_layers": 1}))
    with pytest.raises(UnsupportedConfigError, match="LlamaForCausalLM is not a Gemma family"):
        GemmaDecoder(llama, ReferenceBackend(), layer_specs(llama), 64)
    assert type(make_forward("fused", llama, ReferenceBackend(), layer_specs(llama), 64)) is FusedDecoder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_with_one_plus_w_is_gemmas_bit_for_bit(dtype: torch.dtype) -> None:
    norm = gemma3().model.layers[0].post_feedforward_layernorm
    x = torch.randn(5, 32).to(dtype)
    ops = ReferenceBackend().fused_ops()
    with torch.no_grad():
        want = norm.to(dtype)(x)
    assert torch.equal(ops.rms_norm(x, gemma_weight(norm), norm.eps), want)


def test_embedding_is_scaled_in_the_model_dtype() -> None:
    model = gemma3()
    decoder = _decoder(model)
    ids = torch.tensor([3, 5, 63])
    *_, residual = decoder.first(ids, torch.arange(3))
    with torch.no_grad():
        assert torch.equal(residual, model.model.embed_tokens(ids))
    assert decoder.normalizer.dtype == torch.float32 and float(decoder.normalizer) == pytest.approx(32**0.5)


def test_each_layer_rotates_with_its_layer_types_base() -> None:
    model = gemma3()
    decoder = _decoder(model)
    positions = torch.arange(64)[None]
    probe = torch.empty(1)
    for layer, kind in zip(decoder.layers, model.config.layer_types, strict=True):
        cos, sin = model.model.rotary_emb(probe, positions, kind)
        assert torch.equal(layer.cos_sin, torch.cat((cos[0, :, :8], sin[0, :, :8]), dim=-1))
    assert not torch.equal(decoder.layers[0].cos_sin, decoder.layers[2].cos_sin)  # local and global bases differ


def test_the_layer_after_attention_and_the_capped_logits_match_transformers() -> None:
    model = gemma2()
    decoder = _decoder(model)
    layer, ref = decoder.layers[0], model.model.layers[0]
    attn, residual = torch.randn(4, 2, 16), torch.randn(4, 32)
    hidden, summed = decoder._gemma_finish(layer, attn, residual)
    with torch.no_grad():
        after_attn = residual + ref.post_attention_layernorm(ref.self_attn.o_proj(attn.reshape(4, -1)))
        mlp = ref.post_feedforward_layernorm(ref.mlp(ref.pre_feedforward_layernorm(after_attn)))
        torch.testing.assert_close(summed, after_attn)
        torch.testing.assert_close(hidden, mlp)
        logits = decoder.logits(hidden, summed, None)
        want = model.lm_head(model.model.norm(after_attn + mlp))
        cap = model.config.final_logit_softcapping
        torch.testing.assert_close(logits, torch.tanh(want / cap) * cap)
    assert logits.abs().max() <= cap and want.abs().max() > cap  # the cap was in play
