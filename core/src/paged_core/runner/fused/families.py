"""Which loaded transformers models the fused decoder can run, and why not when it cannot."""

from __future__ import annotations

from typing import Any

from paged_core.runner.fused.gemma_family import GEMMA_FAMILIES, gemma_refusal
from paged_core.runner.fused.moe_layer import MOE_FAMILIES, moe_refusal

FAMILIES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
"""Architectures whose layers are pre-norm RMSNorm, rotary, (GQA) attention and a SiLU-gated MLP."""
ALL_FAMILIES = FAMILIES | frozenset(MOE_FAMILIES) | GEMMA_FAMILIES
"""Those, the MoE families (:data:`~paged_core.runner.fused.moe_layer.MOE_FAMILIES`): the same layers with
routed experts for the MLP of some or all of them, and Gemma2/Gemma3 (:mod:`~paged_core.runner.fused.gemma`)."""

STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})
"""Rotary variants whose frequencies do not depend on the sequence length (so one cos/sin table serves)."""


def fused_refusal(model: Any) -> str | None:
    """``None`` when :class:`~paged_core.runner.fused.FusedDecoder` can run ``model``, else the reason."""
    arch = type(model).__name__
    if arch not in ALL_FAMILIES:
        return f"{arch} is not one of the fused families ({', '.join(sorted(ALL_FAMILIES))})"
    if arch in GEMMA_FAMILIES:
        return gemma_refusal(model)
    config = model.config
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"{arch}: hidden_act {act!r} (the fused MLP is SiLU-gated)"
    if getattr(config, "mlp_bias", False):
        return f"{arch}: mlp_bias is set"
    rotary = getattr(model.model, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", None)
    if rope_type not in STATIC_ROPE:
        return f"{arch}: rope type {rope_type!r} (fused rotary supports {', '.join(sorted(STATIC_ROPE))})"
    assert rotary is not None  # a static rope type was found on it
    layer = model.model.layers[0]
    attn = layer.self_attn
    rotary_dim = int(rotary.inv_freq.numel()) * 2
    if rotary_dim != int(attn.head_dim):
        return f"{arch}: partial rotary ({rotary_dim} of {attn.head_dim} dimensions)"
    if getattr(attn.o_proj, "bias", None) is not None:
        return f"{arch}: o_proj has a bias"
    return moe_refusal(model) if arch in MOE_FAMILIES else None
