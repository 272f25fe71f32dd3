"""The reference dequantizers against gguf's own, the quantizers, and QuantizedWeight's checks."""

from __future__ import annotations

import pytest
import torch

from paged_core.errors import WeightFormatError
from paged_core.quant import (
    FORMATS,
    INT8,
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    Q8_0,
    QuantizedWeight,
    quantize_blocks,
    quantize_int8,
    random_packed,
    reference_linear,
    weight_format,
)

GGUF_FORMATS = [Q4_0, Q4_1, Q8_0, Q4_K, Q6_K]


@pytest.mark.parametrize("fmt", GGUF_FORMATS, ids=lambda f: f.name)
def test_dequantize_equals_gguf_py_bit_for_bit(fmt: object) -> None:
    import gguf  # a dependency of paged-core[models]: missing, the test fails

    w = random_packed(fmt, 5, 512, torch.Generator().manual_seed(3))  # type: ignore[arg-type]
    want = gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType(w.format.ggml_type))
    assert torch.equal(w.dequantize(), torch.from_numpy(want))


@pytest.mark.parametrize("fmt", [Q4_0, Q4_1, Q8_0], ids=lambda f: f.name)
def test_quantize_blocks_round_trips_within_half_a_step(fmt: object) -> None:
    dense = torch.randn(6, 128, generator=torch.Generator().manual_seed(1))
    w = quantize_blocks(dense, fmt)  # type: ignore[arg-type]
    blocks = dense.reshape(6, 4, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / (15 if fmt is not Q8_0 else 254)
    err = (w.dequantize() - dense).abs().reshape(6, 4, 32).amax(-1)
    assert bool((err <= step * 1.01 + 1e-3).all())


def test_int8_is_per_row_symmetric() -> None:
    dense = torch.randn(4, 64) * torch.tensor([[0.01], [1.0], [100.0], [0.0]])
    w = quantize_int8(dense)
    assert w.format is INT8 and w.data.dtype == torch.int8 and w.scale is not None
    assert int(w.data.abs().max()) == 127
    torch.testing.assert_close(w.dequantize(), dense, atol=float(w.scale.max()) / 2 + 1e-6, rtol=0)
    assert torch.equal(w.dequantize()[3], torch.zeros(64))


def test_reference_linear_is_the_dequantized_matmul_rounded_once() -> None:
    w = random_packed(Q4_1, 24, 64, torch.Generator().manual_seed(0))
    x = torch.randn(3, 64).to(torch.bfloat16)
    bias = torch.randn(24)
    got = reference_linear(x, w, bias)
    assert got.dtype == torch.bfloat16
    want = (x.float() @ w.dequantize().T + bias).to(torch.bfloat16)
    assert torch.equal(got, want)


def test_rows_cat_and_select_keep_values() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = random_packed(Q8_0, 5, 64, gen, name="a"), random_packed(Q8_0, 3, 64, gen, name="b")
    merged = QuantizedWeight.cat([a, b])
    assert merged.shape == (8, 64)
    assert torch.equal(merged.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    view = merged.rows(5, 8)
    assert view.data.data_ptr() == merged.data[5].data_ptr()  # a view, not a copy
    assert torch.equal(view.dequantize(), b.dequantize())
    order = torch.tensor([7, 0, 3])
    assert torch.equal(merged.select_rows(order).dequantize(), merged.dequantize()[order])
    with pytest.raises(WeightFormatError, match="cannot merge"):
        QuantizedWeight.cat([a, random_packed(Q4_0, 2, 64, gen)])


def test_merging_views_of_one_merge_again_is_a_view_not_a_copy() -> None:
    gen = torch.Generator().manual_seed(3)
    merged = QuantizedWeight.cat([random_packed(INT8, 4, 64, gen), random_packed(INT8, 2, 64, gen)])
    parts = [merged.rows(0, 4), merged.rows(4, 6)]
    again = QuantizedWeight.cat(parts)
    assert again.data.data_ptr() == merged.data.data_ptr() and again.scale is not None and merged.scale is not None
    assert again.scale.data_ptr() == merged.scale.data_ptr()
    assert torch.equal(again.dequantize(), merged.dequantize())
    swapped = QuantizedWeight.cat(parts[::-1])  # not in storage order: a real copy
    assert swapped.data.data_ptr() != merged.data.data_ptr()
    assert torch.equal(swapped.dequantize(), torch.cat([parts[1].dequantize(), parts[0].dequantize()]))
    gap = QuantizedWeight.cat([merged.rows(0, 2), merged.rows(3, 6)])  # a row left out: a copy
    assert gap.shape == (5, 64) and torch.equal(gap.dequantize(), merged.dequantize()[[0, 1, 3, 4, 5]])


def test_bad_sizes_are_refused_naming_the_tensor() -> None:
    data = torch.zeros(4, 2 * Q4_1.block_bytes - 1, dtype=torch.uint8)
    with pytest.raises(
        WeightFormatError,
        match=r"blk\.3\.attn_q\.weight: data is \(4, 39\) \(156 bytes\), q4_1 "
        r"\(4, 64\) needs \(4, 40\)",
    ):
        QuantizedWeight(Q4_1, (4, 64), data, name="blk.3.attn_q.weight")
    with pytest.raises(WeightFormatError, match="not a multiple of the q4_k block of 256"):
        QuantizedWeight(Q4_K, (4, 64), torch.zeros(4, 36, dtype=torch.uint8), name="w")
    with pytest.raises(WeightFormatError, match="int8 needs an fp32 scale"):
        QuantizedWeight(INT8, (2, 8), torch.zeros(2, 8, dtype=torch.int8), None)
    with pytest.raises(WeightFormatError, match=r"needs torch\.uint8"):
        QuantizedWeight(Q8_0, (2, 32), torch.zeros(2, 34, dtype=torch.int8))


def test_format_lookup_names_the_known_ones() -> None:
    assert weight_format("q6_k") is Q6_K
    with pytest.raises(ValueError, match="unknown weight format 'q5_k'; known: " + ", ".join(FORMATS)):
        weight_format("q5_k")
