"""ReferenceBackend.forward against independent dense oracles (SDPA and a scalar loop)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paged_core.api import AttentionSpec, build_attention_metadata
from paged_core.reference import ReferenceBackend

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def run_step(
    h: SimpleNamespace,
    spec: AttentionSpec,
    query_lens: list[int],
    seq_lens: list[int],
    block_size: int = 4,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, list[torch.Tensor], object]:
    """Cache each row's context directly, then forward its new tokens; return (output, oracle rows, batch)."""
    batch = h.make_batch(seq_lens, spec, block_size, dtype, seed=seed)
    backend = ReferenceBackend("cpu")
    cache = backend.allocate_kv_cache(batch.num_blocks, block_size, spec, dtype)
    h.fill_cache(cache, batch, [s - q for s, q in zip(seq_lens, query_lens, strict=True)], block_size)
    md = build_attention_metadata(query_lens, seq_lens, batch.tables, block_size)
    gen = torch.Generator().manual_seed(seed + 1)
    query = torch.randn(sum(query_lens), spec.num_heads, spec.head_size, generator=gen).to(dtype)
    new_k = torch.cat([k[s - q :] for k, s, q in zip(batch.keys, seq_lens, query_lens, strict=True)])
    new_v = torch.cat([v[s - q :] for v, s, q in zip(batch.values, seq_lens, query_lens, strict=True)])
    out = backend.forward(query, new_k, new_v, cache, md, spec)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    oracle = []
    for b in range(len(seq_lens)):
        qb = query[starts[b] : starts[b + 1]]
        use_naive = spec.sliding_window is not None or spec.logits_soft_cap is not None
        fn = h.naive_oracle if use_naive else h.sdpa_oracle
        oracle.append(fn(qb, batch.keys[b], batch.values[b], spec))
    assert out.dtype == dtype and out.shape == query.shape
    return out, oracle, starts


def assert_rows_match(out: torch.Tensor, oracle: list[torch.Tensor], starts: list[int], dtype: torch.dtype) -> None:
    """Every row's output equals its oracle within the dtype's tolerance."""
    for b, ref in enumerate(oracle):
        torch.testing.assert_close(out[starts[b] : starts[b + 1]].float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_decode_rows_match_sdpa(helpers: SimpleNamespace, dtype: torch.dtype, kv_heads: int) -> None:
    spec = AttentionSpec(num_heads=4, num_kv_heads=kv_heads, head_size=16)
    out, oracle, starts = run_step(helpers, spec, [1, 1, 1, 1], [1, 5, 8, 13], dtype=dtype)
    assert_rows_match(out, oracle, starts, dtype)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefill_rows_match_sdpa(helpers: SimpleNamespace, block_size: int) -> None:
    spec = AttentionSpec(num_heads=6, num_kv_heads=2, head_size=8)
    out, oracle, starts = run_step(helpers, spec, [7, 3, 20], [7, 3, 20], block_size=block_size)
    assert_rows_match(out, oracle, starts, torch.float32)


def test_mixed_decode_and_chunked_prefill(helpers: SimpleNamespace) -> None:
    # Rows 2 and 3 are prefills whose first tokens are already cached (chunked prefill).
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=8, scale=0.3)
    out, oracle, starts = run_step(helpers, spec, [1, 1, 5, 9], [9, 2, 17, 12])
    assert_rows_match(out, oracle, starts, torch.float32)


def test_chunked_prefill_equals_full_prefill_tail(helpers: SimpleNamespace) -> None:
    spec = AttentionSpec(num_heads=2, num_kv_heads=1, head_size=8)
    full, _, _ = run_step(helpers, spec, [12], [12], seed=3)
    # Same K/V and the same query tail, but the first 8 tokens were cached beforehand.
    batch = helpers.make_batch([12], spec, 4, torch.float32, seed=3)
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(batch.num_blocks, 4, spec, torch.float32)
    helpers.fill_cache(cache, batch, [12], 4)
    query = torch.randn(12, 2, 8, generator=torch.Generator().manual_seed(4))
    md = build_attention_metadata([4], [12], batch.tables, 4)
    tail = backend.attention(query[8:], cache, md, spec)
    torch.testing.assert_close(tail, full[8:])


@pytest.mark.parametrize("window", [1, 3, 8])
def test_sliding_window(helpers: SimpleNamespace, window: int) -> None:
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=8, sliding_window=window)
    out, oracle, starts = run_step(helpers, spec, [1, 1, 6], [4, 11, 10])
    assert_rows_match(out, oracle, starts, torch.float32)


def test_soft_cap_and_window_together(helpers: SimpleNamespace) -> None:
    spec = AttentionSpec(num_heads=2, num_kv_heads=1, head_size=8, logits_soft_cap=0.5, sliding_window=4, scale=2.0)
    out, oracle, starts = run_step(helpers, spec, [1, 5], [9, 7])
    assert_rows_match(out, oracle, starts, torch.float32)
    # The cap is strong here (scale 2.0, cap 0.5): without it the result must differ.
    uncapped = AttentionSpec(num_heads=2, num_kv_heads=1, head_size=8, sliding_window=4, scale=2.0)
    out2, _, _ = run_step(helpers, uncapped, [1, 5], [9, 7])
    assert not torch.allclose(out, out2, atol=1e-3)


def test_padding_tokens_beyond_actual_are_zero(helpers: SimpleNamespace) -> None:
    spec = AttentionSpec(num_heads=2, num_kv_heads=2, head_size=4)
    batch = helpers.make_batch([3], spec, 4, torch.float32)
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(batch.num_blocks, 4, spec, torch.float32)
    helpers.fill_cache(cache, batch, [3], 4)
    md = build_attention_metadata([1], [3], batch.tables, 4)
    query = torch.randn(4, 2, 4)  # one real token + three padding rows
    out = backend.attention(query, cache, md, spec)
    assert torch.equal(out[1:], torch.zeros(3, 2, 4))
    torch.testing.assert_close(out[:1], helpers.sdpa_oracle(query[:1], batch.keys[0], batch.values[0], spec))
