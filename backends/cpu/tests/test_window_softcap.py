"""Sliding windows and logits soft caps against the reference backend, every kernel variant.

Blocks wholly before a row's window are the null block or another request's block in these batches, filled
with NaN (or huge values): the kernels must start each row at its window, never read them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from paged_backend_cpu import ops
from paged_core.api import build_attention_metadata
from paged_core.testing import ReferenceBackend

from .conftest import PagedBatch, make_paged_batch

ISAS = ops.supported_isas()
MIXED = ([1, 1, 1, 9, 40, 3], [1, 17, 300, 9, 75, 700])
"""Decodes (one with a single cached token, two long), prefills with and without context, a long prefill chunk."""
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def run(b: PagedBatch, split: int = 0) -> torch.Tensor:
    md = b.metadata
    return ops.attention(
        b.query,
        b.cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        b.spec.softmax_scale,
        split,
        b.spec.sliding_window or 0,
        b.spec.logits_soft_cap or 0.0,
    )


def reference(b: PagedBatch) -> torch.Tensor:
    return ReferenceBackend("cpu").attention(b.query, b.reference_cache, b.metadata, b.spec)


def check(b: PagedBatch, split: int = 0) -> None:
    got, want = run(b, split), reference(b)
    assert torch.isfinite(got).all(), "a garbage block before a window was read"
    tol = max(TOL[b.query.dtype], TOL.get(b.cache.dtype, 0.0))
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("window", [1, 5, 16, 17, 40, 130, 600])
@pytest.mark.parametrize("soft_cap", [None, 30.0])
def test_window_matches_reference_and_never_reads_before_it(
    use_isa: Callable[[str], str], isa: str, window: int, soft_cap: float | None
) -> None:
    use_isa(isa)
    b = make_paged_batch(*MIXED, heads=8, kv_heads=2, window=window, soft_cap=soft_cap, seed=window)
    assert (b.metadata.block_table == 0).any(), "the batch has no stale entry to skip"
    check(b)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("dtype", "kv_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_window_across_dtypes_and_head_sizes(
    use_isa: Callable[[str], str], isa: str, dtype: torch.dtype, kv_dtype: torch.dtype, head_size: int
) -> None:
    """Gemma 2's shape among them: head size 256, a window, soft cap 50."""
    use_isa(isa)
    b = make_paged_batch(
        *MIXED, head_size=head_size, dtype=dtype, kv_dtype=kv_dtype, window=40, soft_cap=50.0, seed=head_size
    )
    check(b)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("soft_cap", [1.0, 5.0, 50.0])
@pytest.mark.parametrize(("dtype", "kv_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_soft_cap_matches_reference(
    use_isa: Callable[[str], str], isa: str, soft_cap: float, dtype: torch.dtype, kv_dtype: torch.dtype
) -> None:
    use_isa(isa)
    b = make_paged_batch(*MIXED, dtype=dtype, kv_dtype=kv_dtype, soft_cap=soft_cap)
    b.query.mul_(4)  # scores of a few units up to tens: the cap bends them
    check(b)
    if soft_cap < 10:  # the cap changes the answer, so a kernel ignoring it would fail above
        uncapped = ReferenceBackend("cpu").attention(b.query, b.reference_cache, b.metadata, type(b.spec)(6, 2, 64))
        assert (uncapped.float() - reference(b).float()).abs().max() > 0.2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("split", [16, 64, 100])
@pytest.mark.parametrize("window", [20, 200])
def test_forced_splits_with_a_window(use_isa: Callable[[str], str], isa: str, split: int, window: int) -> None:
    """Key splits that start before, inside and after a row's window are merged exactly."""
    use_isa(isa)
    b = make_paged_batch([1, 1, 33], [700, 2, 290], heads=8, kv_heads=2, window=window, soft_cap=20.0)
    check(b, split)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("window", [7, 100, 600])
@pytest.mark.parametrize(
    ("dtype", "kv_dtype"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.int8)],
)
def test_window_rows_are_batch_invariant(
    use_isa: Callable[[str], str], isa: str, window: int, dtype: torch.dtype, kv_dtype: torch.dtype
) -> None:
    """A query row's bits are the same decoded alone, decoded among other rows, and inside a prefill chunk."""
    use_isa(isa)
    chunk, length = 37, 1200  # several query tiles; keys split at 512 and 1024
    b = make_paged_batch(
        [1, 9, chunk],
        [800, 60, length],
        heads=8,
        kv_heads=2,
        dtype=dtype,
        kv_dtype=kv_dtype,
        window=window,
        soft_cap=30.0,
    )
    md, spec = b.metadata, b.spec
    bs = md.block_size
    table = md.block_table[2].tolist()
    in_chunk = run(b)[10:]
    others = [md.block_table[0].tolist(), md.block_table[1].tolist()]
    for t in range(chunk):
        pos = length - chunk + t
        q = b.query[10 + t : 11 + t]
        alone = build_attention_metadata([1], [pos + 1], [table], bs)
        got_alone = ops.attention(
            q,
            b.cache,
            alone.query_start_loc,
            alone.seq_lens,
            alone.block_table,
            spec.softmax_scale,
            0,
            window,
            30.0,
        )
        # After another decode row, before a prefill of 9 tokens.
        mixed = build_attention_metadata([1, 1, 9], [800, pos + 1, 60], [others[0], table, others[1]], bs)
        query = torch.cat([b.query[:1], q, b.query[1:10]])
        got_mixed = ops.attention(
            query,
            b.cache,
            mixed.query_start_loc,
            mixed.seq_lens,
            mixed.block_table,
            spec.softmax_scale,
            0,
            window,
            30.0,
        )[1:2]
        assert torch.equal(got_alone, in_chunk[t : t + 1]), f"token {t}: alone != in the prefill chunk"
        assert torch.equal(got_mixed, got_alone), f"token {t}: among other rows != alone"
    assert torch.isfinite(in_chunk).all()
