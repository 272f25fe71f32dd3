"""A tiny random-weight Qwen3-MoE written as a GGUF the way llama.cpp's converter lays out ``qwen3moe``.

Every layer routes its MLP through ``E`` experts (llama.cpp's ``qwen3moe`` has no dense layers and always
renormalises the top-k weights). The expert weights are GGUF's 3-D tensors ``ffn_gate_exps`` / ``ffn_up_exps``
``[E, I, H]`` and ``ffn_down_exps`` ``[E, H, I]`` (row-major, each expert's rows after the previous one's),
packed in ``expert_format``; the attention projections and the LM head in ``linear_format``; the router
(``ffn_gate_inp``), norms and token embedding in F32, as the converter leaves them. A small SentencePiece-style
vocabulary (byte tokens, then pieces) is written too, so transformers and llama.cpp can read a tokenizer.

As a script it writes one file (for a benchmark against llama.cpp): ``python core/tests/gguf_moe_helpers.py
OUT.gguf [--experts q4_0] [--hidden 512 --layers 4 --num-experts 16 --inter 256 --vocab 2048]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paged_core.quant import Q8_0, QuantizedWeight, WeightFormat, quantize_blocks

ATTENTION = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
PIECES = ["▁", *"etaoinsrhldcumfpgwybvkxjqzETAOINSRHLDCUMFPGWYBVKXJQZ0123456789.,;:'\"()-/"]
PIECES += ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁or", "▁be", "▁this", "▁that", "▁for"]


def tiny_moe_config(
    vocab: int = 320, hidden: int = 128, layers: int = 2, experts: int = 8, top_k: int = 2, inter: int = 64
) -> Any:
    """A Qwen3-MoE config every layer of which is sparse, renormalised as llama.cpp's ``qwen3moe`` routes."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * inter,
        moe_intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def _vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """``<unk> <s> </s>``, the 256 byte tokens, then pieces and filler up to ``size`` (SentencePiece types)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    extra = PIECES + [f"▁w{i}" for i in range(size)]
    tokens += extra[: size - len(tokens)]
    types += [1] * (size - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(size - 259)]
    return tokens, scores, types


def _experts_3d(writer: Any, name: str, weight: torch.Tensor, fmt: WeightFormat | str | None, how: str) -> torch.Tensor:
    """``weight`` ``[E, N, K]`` as one GGUF 3-D tensor of ``fmt`` blocks (F32 for ``None``; a GGML type's name
    such as ``"q5_0"`` is quantized by gguf-py: a type paged has no kernel for); returns the values it holds.
    ``how``: ``write``, ``short`` (the last expert dropped: a shape the config disagrees with) or ``skip``."""
    import gguf
    import gguf.quants

    e, n, k = (int(d) for d in weight.shape)
    values = weight.float().clone()
    if fmt is None:
        data = weight.float().numpy()
        raw = None
    elif isinstance(fmt, str):
        raw = gguf.GGMLQuantizationType[fmt.upper()]
        data = gguf.quants.quantize(weight.float().numpy(), raw)
        values = torch.from_numpy(gguf.quants.dequantize(data, raw).copy())
    else:
        q = quantize_blocks(weight.reshape(e * n, k), fmt, name)
        data, raw = q.data.numpy().reshape(e, n, -1), gguf.GGMLQuantizationType(fmt.ggml_type)
        values = q.dequantize().reshape(e, n, k)
    data = np.ascontiguousarray(data[:-1] if how == "short" else data)
    if how != "skip":
        writer.add_tensor(name, data, raw_shape=data.shape if raw is not None else None, raw_dtype=raw)
    return values


def _packed_2d(writer: Any, name: str, weight: torch.Tensor, fmt: WeightFormat) -> QuantizedWeight:
    import gguf

    q = quantize_blocks(weight, fmt, name)
    data = q.data.numpy()
    writer.add_tensor(
        name, np.ascontiguousarray(data), raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType(fmt.ggml_type)
    )
    return q


def write_tiny_moe_gguf(
    path: Path,
    config: Any,
    expert_format: WeightFormat | None = Q8_0,
    linear_format: WeightFormat = Q8_0,
    seed: int = 0,
    down_format: WeightFormat | str | None = "same",
    break_tensor: str | None = None,
    skip_tensor: str | None = None,
) -> dict[str, torch.Tensor]:
    """Write the GGUF; returns the transformers state dict of the values it holds (packed weights dequantized).

    ``expert_format`` ``None`` writes the experts as F32; ``down_format`` lets ``ffn_down_exps`` differ (as in a
    ``Q4_K_M`` file; a GGML type's name such as ``"q5_0"`` writes a type paged has no kernel for).
    ``break_tensor`` writes that expert tensor one expert short, ``skip_tensor`` leaves it out.
    """
    import gguf
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    values: dict[str, torch.Tensor] = {}
    arch = "qwen3moe"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-qwen3-moe")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)  # llama.cpp's n_rot (its default, head_dim, said outright)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    file_type = "ALL_F32" if expert_format is None else f"MOSTLY_{expert_format.name.upper()}"
    writer.add_file_type(gguf.LlamaFileType[file_type])  # what most of the bytes are
    tokens, scores, types = _vocabulary(config.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    def dense(name: str, hf: str, t: torch.Tensor) -> None:
        values[hf] = t.detach().float().clone()
        writer.add_tensor(name, values[hf].numpy())

    def norm(name: str, hf: str, size: int) -> None:
        dense(name, hf, 1.0 + 0.1 * torch.randn(size))

    dense("token_embd.weight", "model.embed_tokens.weight", model.model.embed_tokens.weight)
    norm("output_norm.weight", "model.norm.weight", config.hidden_size)
    values["lm_head.weight"] = _packed_2d(
        writer, "output.weight", model.lm_head.weight.detach(), linear_format
    ).dequantize()
    inter = config.moe_intermediate_size
    for i, layer in enumerate(model.model.layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        norm(b + "attn_norm.weight", p + "input_layernorm.weight", config.hidden_size)
        norm(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", config.hidden_size)
        norm(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", config.head_dim)
        norm(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", config.head_dim)
        for hf, short in ATTENTION.items():
            weight = getattr(attn, hf).weight.detach()
            values[p + f"self_attn.{hf}.weight"] = _packed_2d(
                writer, b + short + ".weight", weight, linear_format
            ).dequantize()
        dense(b + "ffn_gate_inp.weight", p + "mlp.gate.weight", mlp.gate.weight)
        gate_up, parts = mlp.experts.gate_up_proj.detach(), {}
        for role, weight in (("gate", gate_up[:, :inter]), ("up", gate_up[:, inter:]), ("down", mlp.experts.down_proj)):
            name = f"{b}ffn_{role}_exps.weight"
            fmt = expert_format if role != "down" or down_format == "same" else down_format
            how = "short" if name == break_tensor else "skip" if name == skip_tensor else "write"
            parts[role] = _experts_3d(writer, name, weight.detach(), fmt, how)
        values[p + "mlp.experts.gate_up_proj"] = torch.cat((parts["gate"], parts["up"]), 1)
        values[p + "mlp.experts.down_proj"] = parts["down"]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


def dense_moe_oracle(config: Any, values: dict[str, torch.Tensor]) -> Any:
    """transformers' model holding exactly the values the GGUF encodes (packed weights dequantized in fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(values, strict=True)
    return model.eval()


def main() -> None:
    """Write a tiny random Qwen3-MoE GGUF (see the module docstring)."""
    from paged_core.quant import FORMATS

    parser = argparse.ArgumentParser(description="Write a tiny random-weight Qwen3-MoE GGUF.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--experts", default="q4_0", choices=["q4_0", "q4_1", "q8_0"], help="expert tensors' format")
    parser.add_argument("--vocab", type=int, default=320)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--num-experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--inter", type=int, default=64)
    args = parser.parse_args()
    config = tiny_moe_config(args.vocab, args.hidden, args.layers, args.num_experts, args.top_k, args.inter)
    write_tiny_moe_gguf(args.out, config, FORMATS[args.experts])
    print(f"{args.out}: {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
