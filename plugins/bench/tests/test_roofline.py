"""Roofline arithmetic: parameter split, per-request FLOPs, and the two ceilings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_bench.roofline import ModelShape, bandwidth_roofline, flops_roofline


def tiny_llama(tied: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=tied,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # type: ignore[no-any-return]


@pytest.mark.parametrize("tied", [True, False])
def test_shape_splits_body_and_head(tied: bool) -> None:
    model = tiny_llama(tied)
    shape = ModelShape.from_model(model)
    # Per layer: q (32x32), k and v (32x16 each), o (32x32), MLP 3 x (32x64), two norms (32); final norm 32.
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32
    assert shape.body_params == 3 * per_layer + 32
    assert shape.head_params == 1000 * 32
    assert (shape.num_layers, shape.num_heads, shape.head_dim, shape.element_size) == (3, 4, 8, 2)
    assert shape.weight_bytes_per_token == (shape.body_params + 32000) * 2


def test_request_flops_by_hand() -> None:
    s = ModelShape(body_params=10, head_params=5, num_layers=2, num_heads=3, head_dim=4, element_size=2)
    # Prompt 3, output 2: tokens at positions 0..3 are computed (4 tokens), contexts 1+2+3+4 = 10.
    assert s.request_flops(3, 2) == 2 * 10 * 4 + 2 * 5 * 2 + 4 * 2 * 3 * 4 * 10
    # The first 2 positions cached: positions 2 and 3 computed, contexts 3 + 4.
    assert s.request_flops(3, 2, num_cached=2) == 2 * 10 * 2 + 2 * 5 * 2 + 4 * 2 * 3 * 4 * 7


def test_ceilings() -> None:
    s = ModelShape(body_params=1000, head_params=0, num_layers=1, num_heads=1, head_dim=1, element_size=2)
    flops = s.request_flops(10, 10)
    roof = flops_roofline(s, [(10, 10, 0)], seconds=2.0, gemm={"flops_per_s": flops})
    assert roof["fraction"] == pytest.approx(0.5)
    assert roof["bound_output_tok_s"] == pytest.approx(10.0)
    bw = bandwidth_roofline(s, decode_tok_s=50.0, copy={"bytes_per_s": 200_000})
    assert bw["bound_tok_s"] == pytest.approx(100.0) and bw["fraction"] == pytest.approx(0.5)


def tiny_qwen3_moe(dense_layers: list[int]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        vocab_size=500,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=8,
        num_experts_per_tok=3,
        mlp_only_layers=dense_layers,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # type: ignore[no-any-return]


def test_moe_counts_the_active_experts_of_dense_expert_weights() -> None:
    model = tiny_qwen3_moe(dense_layers=[1])  # layer 1 keeps a dense MLP: two MoE layers
    shape = ModelShape.from_model(model)
    # Per layer: q (32x32), k and v (32x16 each), o (32x32), four norms (32, 32, 8, 8); final norm 32.
    attention = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 2 * 32 + 2 * 8
    experts = 8 * 3 * 32 * 16  # gate, up and down of each of the 8 experts
    router = 8 * 32
    dense_mlp = 3 * 32 * 48
    body = 3 * attention + 2 * (experts + router) + dense_mlp + 32
    assert shape.body_params == body and shape.head_params == 500 * 32
    moe = shape.moe
    assert moe is not None and (moe.num_layers, moe.num_experts, moe.top_k) == (2, 8, 3)
    assert (moe.params, moe.active_params) == (2 * experts, 2 * 3 * 3 * 32 * 16)
    assert (moe.bytes, moe.active_bytes) == (2 * experts * 2, 2 * 3 * 3 * 32 * 16 * 2)
    assert moe.modules == ("Qwen3MoeExperts",)
    total = (body + 500 * 32) * 2
    per_token = total - 2 * experts * 2 + 2 * 3 * 3 * 32 * 16 * 2
    assert (shape.total_weight_bytes, shape.weight_bytes_per_token) == (total, per_token)
    assert shape.active_body_params == body - 2 * experts + 2 * 3 * 3 * 32 * 16
    bw = bandwidth_roofline(shape, decode_tok_s=10.0, copy={"bytes_per_s": 100 * per_token})
    assert bw["bound_tok_s"] == pytest.approx(100.0) and bw["fraction"] == pytest.approx(0.1)
    assert bw["total_weight_bytes"] == total and bw["weight_bytes_per_token"] == per_token
    assert bw["moe"]["active_expert_share"] == pytest.approx(2 * 3 * 3 * 32 * 16 * 2 / per_token)
    # A token's FLOPs pass through its active experts only.
    assert shape.request_flops(1, 1) == 2 * (body - 2 * experts + 2 * 3 * 3 * 32 * 16) + 2 * 500 * 32 + 4 * 3 * 4 * 8


def test_dense_model_has_no_moe_figures() -> None:
    shape = ModelShape.from_model(tiny_llama(tied=False))
    assert shape.moe is None and shape.moe_figures() is None
    assert shape.weight_bytes_per_token == shape.total_weight_bytes


def _moe_helpers() -> Any:
    """core's tiny Qwen3-MoE GGUF writer (a test helper of another distribution, loaded by path)."""
    path = Path(__file__).resolve().parents[3] / "core" / "tests" / "gguf_moe_helpers.py"
    spec = importlib.util.spec_from_file_location("paged_bench_tests_gguf_moe_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_moe_counts_the_packed_bytes_of_gguf_experts(tmp_path: Path) -> None:
    from paged_core.loading.gguf_packed import load_packed_gguf
    from paged_core.quant import Q4_0, Q8_0

    helpers = _moe_helpers()
    vocab, hidden, layers, experts, top_k, inter = 320, 128, 2, 8, 2, 64
    config = helpers.tiny_moe_config(vocab, hidden, layers, experts, top_k, inter)
    path = tmp_path / "moe.gguf"
    helpers.write_tiny_moe_gguf(path, config, expert_format=Q4_0, linear_format=Q8_0)
    model = load_packed_gguf(path, config, torch.float32)
    shape = ModelShape.from_model(model)

    # GGUF blocks of 32 values: q4_0 18 bytes, q8_0 34 bytes; norms and the router stay F32.
    expert_values = layers * experts * 3 * inter * hidden
    expert_bytes = expert_values // 32 * 18
    active_bytes = layers * top_k * 3 * inter * hidden // 32 * 18
    q_out, kv_out = 4 * 64, 2 * 64
    linear_values = layers * (q_out + 2 * kv_out) * hidden + layers * hidden * q_out + vocab * hidden
    f32 = layers * (2 * hidden + 2 * 64 + experts * hidden) + hidden
    total = expert_bytes + linear_values // 32 * 34 + 4 * f32
    moe = shape.moe
    assert moe is not None and moe.modules == ("PackedExpertsModule",)
    assert (moe.num_layers, moe.num_experts, moe.top_k) == (layers, experts, top_k)
    assert (moe.bytes, moe.active_bytes) == (expert_bytes, active_bytes)
    assert (moe.params, moe.active_params) == (expert_values, layers * top_k * 3 * inter * hidden)
    assert shape.total_weight_bytes == total
    assert shape.weight_bytes_per_token == total - expert_bytes + active_bytes
    figures = shape.moe_figures()
    assert figures is not None
    assert figures["active_expert_share"] == pytest.approx(active_bytes / (total - expert_bytes + active_bytes))
