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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 7])
def test_a_token_has_the_same_bits_in_a_chunk_as_a_decode_row_in_any_batch(
    helpers: SimpleNamespace, dtype: torch.dtype, window: int | None
) -> None:
    # Batch invariance (capabilities().batch_invariant): positions 560..599 of a 600-token row, as one
    # prefill chunk, as chunks of 1..13 tokens among other rows, and as decode rows in shuffled order.
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=16, sliding_window=window)
    lens = [600, 9, 130]
    batch = helpers.make_batch(lens, spec, 16, dtype, seed=5)
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(batch.num_blocks, 16, spec, dtype)
    helpers.fill_cache(cache, batch, lens, 16)
    query = torch.randn(600, 4, 16, generator=torch.Generator().manual_seed(6)).to(dtype)
    other = torch.randn(20, 4, 16, generator=torch.Generator().manual_seed(7)).to(dtype)

    def step(rows: list[tuple[int, int, int]], q: torch.Tensor) -> torch.Tensor:
        """Attention of rows ``(sequence, query_len, seq_len)`` (decodes first) over the filled cache."""
        md = build_attention_metadata(
            [r[1] for r in rows], [r[2] for r in rows], [batch.tables[r[0]] for r in rows], 16
        )
        return backend.attention(q, cache, md, spec)

    chunk = step([(0, 40, 600)], query[560:])
    shuffled = [(1, 1, 9)] + [(0, 1, p + 1) for p in range(599, 559, -1)]
    decodes = step(shuffled, torch.cat([other[:1], query[560:].flip(0)]))
    assert torch.equal(decodes[1:].flip(0), chunk)
    start = 560
    for size in (1, 13, 4, 2, 7, 13):
        end = start + size
        if size == 1:  # a decode row: decodes come first
            out = step([(1, 1, 9), (0, 1, end), (2, 5, 130)], torch.cat([other[:1], query[start:end], other[1:6]]))[1:2]
        else:
            out = step([(1, 1, 9), (2, 5, 130), (0, size, end)], torch.cat([other[:6], query[start:end]]))[6:]
        assert torch.equal(out, chunk[start - 560 : end - 560]), (start, size)
        start = end
    assert start == 600
