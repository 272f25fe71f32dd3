"""Tiny random-weight decoder models of several architectures, built from a config in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 512


def _common(**extra: Any) -> dict[str, Any]:
    base = {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 1024,
        # Wide weights make the logits peaky, so greedy choices are not decided by rounding.
        "initializer_range": 0.3,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    base.update(extra)
    return base


def _qwen3() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**_common())


def _mistral() -> Any:
    from transformers import MistralConfig

    # A window shorter than most prompts, so sliding-window attention is really exercised.
    return MistralConfig(**_common(sliding_window=48))


def _gemma2() -> Any:
    from transformers import Gemma2Config

    return Gemma2Config(
        **_common(
            sliding_window=40, attn_logit_softcapping=30.0, final_logit_softcapping=20.0, query_pre_attn_scalar=48
        )
    )


def _gemma3() -> Any:
    from transformers import Gemma3TextConfig

    # Two sliding layers to one full one (Gemma 3 has five to one): three KV-cache groups of one layer.
    layers = ["sliding_attention", "sliding_attention", "full_attention"]
    return Gemma3TextConfig(
        **_common(num_hidden_layers=3, sliding_window=24, layer_types=layers, query_pre_attn_scalar=48)
    )


def _mistral16() -> Any:
    from transformers import MistralConfig

    # Every layer slides over 16 tokens: one block of 16 plus the one being written is all a decode needs.
    return MistralConfig(**_common(sliding_window=16))


def _qwen3_moe() -> Any:
    from transformers import Qwen3MoeConfig

    # Eight experts, two per token, renormalised; the middle layer dense (mlp_only_layers), so the fused decoder's
    # steps pass from a MoE layer to a dense one and back.
    return Qwen3MoeConfig(
        **_common(
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        )
    )


def _mixtral() -> Any:
    from transformers import MixtralConfig

    # Four experts, two per token (Mixtral's routing always renormalises), every layer MoE.
    return MixtralConfig(**_common(num_local_experts=4, num_experts_per_tok=2, intermediate_size=128))


ARCHITECTURES = {"qwen3": _qwen3, "mistral": _mistral, "gemma2": _gemma2, "gemma3": _gemma3}
"""The architectures of the parity battery (test_tiny_architectures.py)."""
MOE = {"qwen3_moe": _qwen3_moe, "mixtral": _mixtral}
"""Mixture-of-experts models (test_tiny_architectures.py runs the battery on them, both model paths, eagerly)."""
EXTRA = {"mistral16": _mistral16, **MOE}
"""Further tiny models for single tests."""


def save_tiny_model(arch: str, directory: Path, seed: int = 0) -> Path:
    """Build ``arch`` with random weights (seeded) and save it as safetensors under ``directory``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config({**ARCHITECTURES, **EXTRA}[arch](), dtype=torch.float32)
    out = directory / arch
    model.save_pretrained(out)
    return out
