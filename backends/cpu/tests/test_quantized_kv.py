"""int8 / float8 KV caches: write_kv quantizes bit for bit as paged_core's rule, attention reads them in place."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from paged_backend_cpu import CpuBackend, layout, ops
from paged_core.api import AttentionSpec, build_attention_metadata, dequantize_kv, quantize_kv
from paged_core.testing import ReferenceBackend

from .conftest import make_paged_batch

ISAS = ops.supported_isas()
QUANTIZED = [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2]
MIXED = ([1, 1, 1, 9, 40], [1, 17, 300, 9, 75])
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def quantized_standard(
    blocks: int, block_size: int, kv_dtype: torch.dtype, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """A zero default-layout cache with ``key``/``value`` quantized by the reference at ``slots`` (-1 skipped)."""
    kv_heads, head_size = key.shape[1], key.shape[2]
    std = torch.zeros(2, blocks, block_size, kv_heads, head_size + 2, dtype=kv_dtype)
    flat = std.view(torch.uint8).view(2, blocks * block_size, kv_heads, head_size + 2)
    keep = slots >= 0
    flat[0, slots[keep]] = quantize_kv(key[keep], kv_dtype).view(torch.uint8)
    flat[1, slots[keep]] = quantize_kv(value[keep], kv_dtype).view(torch.uint8)
    return std


def awkward_rows(tokens: int, kv_heads: int, head_size: int, dtype: torch.dtype, qmax: float) -> torch.Tensor:
    """Random vectors over many magnitudes, plus vectors whose elements fall on rounding ties and edges."""
    gen = torch.Generator().manual_seed(int(qmax))
    x = torch.randn(tokens, kv_heads, head_size, generator=gen)
    x *= torch.logspace(-6, 4, tokens).view(tokens, 1, 1)  # tiny (scale clamped at 2**-24) .. large
    top = torch.finfo(dtype).max if dtype != torch.float32 else 1e30
    x = x.clamp(-top / 2, top / 2)
    x[0] = 0.0  # an all-zero vector
    # scale = qmax / qmax = 1: elements are exactly the scaled values, halves included (ties to even)
    ties = torch.arange(head_size, dtype=torch.float32) * 0.5 - head_size / 4
    ties[0] = qmax
    x[1] = ties
    x[2, 0] = -x[2].abs().max() * 1.0001  # the clamp at -qmax
    return x.to(dtype)


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_size", [64, 80])
def test_write_kv_quantizes_like_the_reference(kv_dtype: torch.dtype, dtype: torch.dtype, head_size: int) -> None:
    backend = CpuBackend("cpu")
    spec = AttentionSpec(4, 2, head_size)
    blocks, block_size, tokens = 5, 16, 48
    cache = backend.allocate_kv_cache(blocks, block_size, spec, kv_dtype)
    assert cache.shape == (2, blocks, 2, block_size, head_size + 2) and cache.dtype == kv_dtype
    qmax = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}[kv_dtype]
    key = awkward_rows(tokens, 2, head_size, dtype, qmax)
    value = -awkward_rows(tokens, 2, head_size, dtype, qmax).flip(0)
    slots = torch.randperm(blocks * block_size, generator=torch.Generator().manual_seed(1))[:tokens]
    slots[5] = slots[17] = -1  # padding
    ops.write_kv(key, value, cache, slots)
    want = quantized_standard(blocks, block_size, kv_dtype, slots, key, value)
    assert torch.equal(cache.view(torch.uint8), layout.from_standard(want).view(torch.uint8))
    assert torch.equal(layout.to_standard(cache).view(torch.uint8), want.view(torch.uint8))


def test_write_kv_rounds_int8_ties_to_even() -> None:
    """With max |x| = 127 the scale is 1, so x = 2.5 must store 2 and -3.5 must store -4."""
    cache = torch.zeros(2, 1, 1, 16, 66, dtype=torch.int8)
    key = torch.zeros(1, 1, 64)
    key[0, 0, :4] = torch.tensor([127.0, 2.5, -3.5, 0.5])
    ops.write_kv(key, key, cache, torch.tensor([0]))
    std = layout.to_standard(cache)
    assert std[0, 0, 0, 0, :4].tolist() == [127, 2, -4, 0]
    assert std.view(torch.uint8)[0, 0, 0, 0, 64:].contiguous().view(torch.float16).item() == 1.0


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_dtype", QUANTIZED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_size", [64, 80, 128, 256])
def test_attention_reads_the_quantized_values(
    use_isa: Callable[[str], str], isa: str, kv_dtype: torch.dtype, dtype: torch.dtype, head_size: int
) -> None:
    """The kernels' result over a quantized cache is the reference's over its dequantized values."""
    use_isa(isa)
    b = make_paged_batch(*MIXED, head_size=head_size, dtype=dtype, kv_dtype=kv_dtype, seed=head_size)
    md = b.metadata
    got = ops.attention(b.query, b.cache, md.query_start_loc, md.seq_lens, md.block_table, b.spec.softmax_scale)
    want = ReferenceBackend("cpu").attention(b.query, b.reference_cache, md, b.spec)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_dtype", QUANTIZED)
@pytest.mark.parametrize("split", [0, 64])
def test_quantized_with_window_soft_cap_and_splits(
    use_isa: Callable[[str], str], isa: str, kv_dtype: torch.dtype, split: int
) -> None:
    use_isa(isa)
    b = make_paged_batch([1, 1, 33], [700, 2, 290], heads=8, kv_heads=2, kv_dtype=kv_dtype, window=100, soft_cap=20.0)
    md = b.metadata
    got = ops.attention(
        b.query, b.cache, md.query_start_loc, md.seq_lens, md.block_table, b.spec.softmax_scale, split, 100, 20.0
    )
    want = ReferenceBackend("cpu").attention(b.query, b.reference_cache, md, b.spec)
    assert torch.isfinite(got).all(), "a garbage block before a window was read"
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_copy_blocks_carries_the_scales(kv_dtype: torch.dtype) -> None:
    caches = [make_paged_batch([1], [60], kv_dtype=kv_dtype, seed=s).cache for s in range(2)]
    before = [c.clone() for c in caches]
    CpuBackend("cpu").copy_blocks(caches, torch.tensor([[1, 3], [2, 0]]))
    for c, b in zip(caches, before, strict=True):
        raw, old = c.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(raw[:, 3], old[:, 1]) and torch.equal(raw[:, 0], old[:, 2])
        assert torch.equal(raw[:, 1:3], old[:, 1:3]) and torch.equal(raw[:, 4], old[:, 4])
        scales = layout.to_standard(c).view(torch.uint8)[:, 3, ..., 64:]
        assert bool(scales.ne(0).any()), "the copied block holds no scale to carry"


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_forward_end_to_end(kv_dtype: torch.dtype) -> None:
    """Backend.forward (write_kv, then attention) on a quantized cache against the reference arithmetic."""
    b = make_paged_batch([1, 1, 5], [12, 40, 20], dtype=torch.bfloat16, kv_dtype=kv_dtype)
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(7, 2, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(7, 2, 64, generator=gen).to(torch.bfloat16)
    md = b.metadata
    std = b.standard.clone()
    flat = std.view(torch.uint8).view(2, -1, 2, 66)
    flat[0, md.slot_mapping] = quantize_kv(k, kv_dtype).view(torch.uint8)
    flat[1, md.slot_mapping] = quantize_kv(v, kv_dtype).view(torch.uint8)
    got = CpuBackend("cpu").forward(b.query, k, v, b.cache, md, b.spec)
    assert torch.equal(layout.to_standard(b.cache).view(torch.uint8), std.view(torch.uint8))
    want = ReferenceBackend("cpu").attention(b.query, dequantize_kv(std), md, b.spec)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


def test_backend_allocates_the_default_quantized_shape() -> None:
    backend = CpuBackend("cpu")
    spec = AttentionSpec(9, 3, 64)
    for kv_dtype in QUANTIZED:
        assert kv_dtype in backend.capabilities().kv_cache_dtypes
        shape = backend.kv_cache_shape_for(10, 16, spec, kv_dtype)
        assert shape == (2, 10, 3, 16, 66)  # 2 bytes per vector for its float16 scale
        cache = backend.allocate_kv_cache(10, 16, spec, kv_dtype)
        assert cache.shape == shape and cache.dtype == kv_dtype and not cache.view(torch.uint8).any()
    md = build_attention_metadata([1], [5], [[1]], 16)
    with pytest.raises(RuntimeError, match=r"kv_cache head_size 64 != query head_size 64 \+ 2"):
        ops.attention(
            torch.zeros(1, 9, 64),
            torch.zeros(2, 4, 3, 16, 64, dtype=torch.int8),
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            0.1,
        )
