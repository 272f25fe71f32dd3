"""The reference backend's KV caches in another dtype: int8/fp8 with per token-head scales, and floats other than
the compute dtype."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paged_core.api import (
    AttentionSpec,
    PagedError,
    UnsupportedConfigError,
    build_attention_metadata,
    dequantize_kv,
    quantize_kv,
)
from paged_core.reference import ReferenceBackend

QUANTIZED = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
SPEC = AttentionSpec(num_heads=8, num_kv_heads=2, head_size=64)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_write_kv_stores_quantize_kv_at_each_slot_and_skips_padding(kv_dtype: torch.dtype) -> None:
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(8, 4, SPEC, kv_dtype)
    assert cache.shape == (2, 8, 4, 2, 66) and cache.dtype == kv_dtype
    md = build_attention_metadata([1, 3], [6, 3], [[6, 2], [5]], block_size=4)
    md.slot_mapping = torch.cat([md.slot_mapping, torch.tensor([-1])])
    gen = torch.Generator().manual_seed(0)
    key, value = (3 * torch.randn(5, 2, 64, generator=gen) for _ in range(2))
    backend.write_kv(key, value, cache, md)
    flat = cache.view(2, 32, 2, 66)
    for t, slot in enumerate(md.slot_mapping[:4].tolist()):
        assert torch.equal(_bits(flat[0, slot]), _bits(quantize_kv(key[t], kv_dtype)))
        assert torch.equal(_bits(flat[1, slot]), _bits(quantize_kv(value[t], kv_dtype)))
    written = {s for s in md.slot_mapping[:4].tolist()}
    untouched = [s for s in range(32) if s not in written]
    assert not _bits(flat[:, untouched]).any()  # the padding token went nowhere


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
def test_attention_reads_the_dequantized_values(
    kv_dtype: torch.dtype, compute: torch.dtype, helpers: SimpleNamespace
) -> None:
    """Decode and a prefill chunk over cached context equal a dense oracle on dequantize_kv(quantize_kv(k)),
    and differ from the unquantized keys by what the rounding does (so the quantization is really there)."""
    backend = ReferenceBackend()
    seq_lens, query_lens = [37, 21], [1, 5]
    batch = helpers.make_batch(seq_lens, SPEC, 16, torch.float32, seed=3)
    cache = backend.allocate_kv_cache(batch.num_blocks, 16, SPEC, kv_dtype)
    write = build_attention_metadata(seq_lens, seq_lens, batch.tables, block_size=16)
    backend.write_kv(torch.cat(batch.keys).to(compute), torch.cat(batch.values).to(compute), cache, write)
    md = build_attention_metadata(query_lens, seq_lens, batch.tables, block_size=16)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(sum(query_lens), SPEC.num_heads, SPEC.head_size, generator=gen).to(compute)
    out = backend.attention(q, cache, md, SPEC)
    assert out.dtype == compute
    start = 0
    for b, ql in enumerate(query_lens):
        k = dequantize_kv(quantize_kv(batch.keys[b].to(compute), kv_dtype))
        v = dequantize_kv(quantize_kv(batch.values[b].to(compute), kv_dtype))
        want = helpers.sdpa_oracle(q[start : start + ql], k, v, SPEC)
        exact = helpers.sdpa_oracle(q[start : start + ql], batch.keys[b], batch.values[b], SPEC)
        got = out[start : start + ql].float()
        tol = 1e-5 if compute == torch.float32 else 1e-2
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        if compute == torch.float32:  # the rounding is really there: far above the oracle's own error
            assert (got - exact).abs().max() > 100 * (got - want).abs().max()
        start += ql


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_a_rows_bits_do_not_depend_on_its_batch(kv_dtype: torch.dtype, helpers: SimpleNamespace) -> None:
    """Scales are per token-head, so a row alone and the same row beside others store and read the same bits."""
    backend = ReferenceBackend()
    batch = helpers.make_batch([19, 33, 8], SPEC, 16, torch.bfloat16, seed=5)
    q = torch.randn(3, SPEC.num_heads, SPEC.head_size, generator=torch.Generator().manual_seed(6)).bfloat16()
    together_cache = backend.allocate_kv_cache(batch.num_blocks, 16, SPEC, kv_dtype)
    lens = [19, 33, 8]
    backend.write_kv(
        torch.cat(batch.keys),
        torch.cat(batch.values),
        together_cache,
        build_attention_metadata(lens, lens, batch.tables, 16),
    )
    together = backend.attention(q, together_cache, build_attention_metadata([1, 1, 1], lens, batch.tables, 16), SPEC)
    alone_cache = backend.allocate_kv_cache(batch.num_blocks, 16, SPEC, kv_dtype)
    md = build_attention_metadata([19], [19], batch.tables[:1], 16)
    backend.write_kv(batch.keys[0], batch.values[0], alone_cache, md)
    alone = backend.attention(q[:1], alone_cache, build_attention_metadata([1], [19], batch.tables[:1], 16), SPEC)
    assert torch.equal(_bits(alone[0]), _bits(together[0]))
    blocks = batch.tables[0]
    assert torch.equal(_bits(alone_cache[:, blocks]), _bits(together_cache[:, blocks]))


def test_a_float_cache_other_than_the_compute_dtype(helpers: SimpleNamespace) -> None:
    """fp32 compute over a bf16 cache: the keys are rounded to bf16 once, attention runs on those."""
    backend = ReferenceBackend()
    batch = helpers.make_batch([23], SPEC, 16, torch.float32, seed=7)
    cache = backend.allocate_kv_cache(batch.num_blocks, 16, SPEC, torch.bfloat16)
    backend.write_kv(batch.keys[0], batch.values[0], cache, build_attention_metadata([23], [23], batch.tables, 16))
    q = torch.randn(1, SPEC.num_heads, SPEC.head_size, generator=torch.Generator().manual_seed(8))
    out = backend.attention(q, cache, build_attention_metadata([1], [23], batch.tables, 16), SPEC)
    assert out.dtype == torch.float32
    want = helpers.sdpa_oracle(q, batch.keys[0].bfloat16(), batch.values[0].bfloat16(), SPEC)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_copy_blocks_copies_values_and_scales(kv_dtype: torch.dtype) -> None:
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(4, 2, SPEC, kv_dtype)
    md = build_attention_metadata([2], [2], [[1]], block_size=2)
    backend.write_kv(torch.randn(2, 2, 64), torch.randn(2, 2, 64), cache, md)
    backend.copy_blocks([cache], torch.tensor([[1, 3]]))
    assert torch.equal(_bits(cache[:, 3]), _bits(cache[:, 1])) and _bits(cache[:, 1]).any()


def test_a_cache_of_the_wrong_width_is_refused() -> None:
    backend = ReferenceBackend()
    md = build_attention_metadata([1], [1], [[1]], block_size=2)
    plain_width = torch.zeros(2, 2, 2, 2, 64, dtype=torch.int8)  # no room for the scales
    with pytest.raises(PagedError, match="key"):
        backend.write_kv(torch.randn(1, 2, 64), torch.randn(1, 2, 64), plain_width, md)
    with pytest.raises(PagedError, match=r"heads/head_size \(2, 62\)"):
        backend.attention(torch.randn(1, 8, 64), plain_width, md, SPEC)


def test_an_odd_head_size_cannot_be_quantized() -> None:
    spec = AttentionSpec(num_heads=2, num_kv_heads=1, head_size=7)
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(2, 2, spec, torch.int8)
    md = build_attention_metadata([1], [1], [[1]], block_size=2)
    with pytest.raises(UnsupportedConfigError, match="even head_size"):
        backend.write_kv(torch.randn(1, 1, 7), torch.randn(1, 1, 7), cache, md)
