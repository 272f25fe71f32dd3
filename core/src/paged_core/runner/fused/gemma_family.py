"""Which Gemma models the fused decoder runs (:mod:`~paged_core.runner.fused.gemma`), and why not otherwise."""

from __future__ import annotations

from typing import Any

GEMMA_FAMILIES = frozenset({"Gemma2ForCausalLM", "Gemma3ForCausalLM"})
"""Gemma architectures the fused decoder runs (text only: Gemma3's vision model stays on transformers)."""
GELU_APPROXIMATE = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
"""transformers' activation names for Gemma's gated MLP, and torch's ``gelu`` approximation of each."""
_STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})


def rope_types(model: Any) -> dict[str, str | None]:
    """Each layer type's rope type (Gemma2 has one rotary for every layer: key ``""``)."""
    rotary = model.model.rotary_emb
    kinds = getattr(rotary, "rope_type", None)
    if isinstance(kinds, dict):
        return {str(k): v for k, v in kinds.items()}
    return {"": kinds}


def gemma_refusal(model: Any) -> str | None:
    """``None`` when :class:`GemmaDecoder` can run ``model`` (a Gemma2/Gemma3 causal LM), else the reason."""
    arch = type(model).__name__
    if arch not in GEMMA_FAMILIES:
        return f"{arch} is not a Gemma family the fused decoder runs"
    config = model.config
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act not in GELU_APPROXIMATE:
        return f"{arch}: hidden_activation {act!r} (the fused Gemma MLP runs {', '.join(sorted(GELU_APPROXIMATE))})"
    if getattr(config, "use_bidirectional_attention", False):
        return f"{arch}: use_bidirectional_attention is set (paged attention is causal)"
    kinds = rope_types(model)
    types = set(getattr(config, "layer_types", None) or ())
    if "" not in kinds and not types <= set(kinds):
        return f"{arch}: no rotary for layer types {sorted(types - set(kinds))}"
    for kind, rope in kinds.items():
        if rope not in _STATIC_ROPE:
            where = f" ({kind})" if kind else ""
            return f"{arch}: rope type {rope!r}{where} (fused rotary supports {', '.join(sorted(_STATIC_ROPE))})"
    attn = model.model.layers[0].self_attn
    if getattr(attn.o_proj, "bias", None) is not None:
        return f"{arch}: o_proj has a bias"
    if getattr(model.model.layers[0].mlp.down_proj, "bias", None) is not None:
        return f"{arch}: the MLP has biases"
    return None
