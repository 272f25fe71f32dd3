"""Roofline arithmetic: parameter split, per-request FLOPs, and the two ceilings."""

from __future__ import annotations

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
