"""A tiny random-weight Llama written as a GGUF with packed linear weights, laid out as llama.cpp's converter does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from paged_core.quant import Q4_1, QuantizedWeight, WeightFormat, quantize_blocks, random_packed

GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def tiny_config(tie: bool = True) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=320,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )


def converter_rows(n: int, heads: int) -> torch.Tensor:
    """The output-row order llama.cpp's converter gives q/k (``heads`` of rotary halves interleaved)."""
    return torch.arange(n).reshape(heads, 2, n // heads // 2).transpose(1, 2).reshape(n)


def _pack(weight: torch.Tensor, fmt: WeightFormat, name: str) -> QuantizedWeight:
    if fmt.name in ("q4_0", "q4_1", "q8_0"):
        return quantize_blocks(weight, fmt, name)
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    return random_packed(fmt, int(weight.shape[0]), int(weight.shape[1]), gen, scale=0.05, name=name)


def write_tiny_gguf(
    path: Path,
    config: Any,
    formats: dict[str, WeightFormat] | WeightFormat = Q4_1,
    embed_format: WeightFormat | None = None,
    seed: int = 0,
    break_tensor: str | None = None,
) -> dict[str, torch.Tensor]:
    """Write the GGUF; returns the HF state dict of the values it holds (packed weights dequantized).

    ``formats`` maps HF projection names (``self_attn.q_proj``...) to a format (one format: all).
    ``break_tensor`` writes that GGUF tensor with one output row too few (a shape the config disagrees with).
    """
    import gguf
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    values: dict[str, torch.Tensor] = {}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)

    def dense(name: str, hf: str, t: torch.Tensor) -> None:
        values[hf] = t.detach().float().clone()
        writer.add_tensor(name, t.detach().float().numpy())

    def packed(name: str, hf: str, t: torch.Tensor, fmt: WeightFormat, heads: int | None = None) -> None:
        q = _pack(t.detach(), fmt, name)
        values[hf] = q.dequantize()
        if heads is not None:
            q = q.select_rows(converter_rows(q.out_features, heads))
        data = q.data.numpy()
        if name == break_tensor:
            data = data[:-1]
        writer.add_tensor(
            name, np.ascontiguousarray(data), raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType(fmt.ggml_type)
        )

    embed = model.model.embed_tokens.weight
    if embed_format is None:
        dense("token_embd.weight", "model.embed_tokens.weight", embed)
    else:
        packed("token_embd.weight", "model.embed_tokens.weight", embed, embed_format)
    if config.tie_word_embeddings:
        values["lm_head.weight"] = values["model.embed_tokens.weight"]
    else:
        packed(
            "output.weight",
            "lm_head.weight",
            model.lm_head.weight,
            formats if isinstance(formats, WeightFormat) else formats.get("lm_head", Q4_1),
        )
    dense("output_norm.weight", "model.norm.weight", model.model.norm.weight + 0.1 * torch.randn(config.hidden_size))
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        dense(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", layer.input_layernorm.weight)
        dense(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        for hf, short in GGUF_NAMES.items():
            fmt = formats if isinstance(formats, WeightFormat) else formats[hf]
            heads = {
                "self_attn.q_proj": config.num_attention_heads,
                "self_attn.k_proj": config.num_key_value_heads,
            }.get(hf)
            packed(f"blk.{i}.{short}.weight", p + hf + ".weight", layer.get_submodule(hf).weight, fmt, heads)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


def dense_oracle(config: Any, values: dict[str, torch.Tensor]) -> Any:
    """transformers' model holding exactly the values the GGUF encodes (packed weights dequantized in fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(values, strict=True)
    return model.eval()
