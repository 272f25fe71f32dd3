"""Every kernel variant this CPU runs against the core's reference backend, across the declared envelope."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from paged_backend_cpu import ops
from paged_core.testing import ReferenceBackend

from .conftest import make_paged_batch

ISAS = ops.supported_isas()
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
MIXED = ([1, 1, 1, 9, 40], [1, 17, 300, 9, 75])
"""Decodes (one with a single cached token, one long) then prefills, with and without cached context."""


def check(batch_args: tuple[list[int], list[int]], split: int = 0, **kw: object) -> None:
    b = make_paged_batch(*batch_args, **kw)  # type: ignore[arg-type]
    ref_cache = b.standard.to(b.query.dtype)
    want = ReferenceBackend("cpu").attention(b.query, ref_cache, b.metadata, b.spec)
    got = ops.attention(
        b.query,
        b.cache,
        b.metadata.query_start_loc,
        b.metadata.seq_lens,
        b.metadata.block_table,
        b.spec.softmax_scale,
        split,
    )
    assert got.dtype == b.query.dtype and got.shape == b.query.shape
    tol = max(TOL[b.query.dtype], TOL[b.cache.dtype])
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("dtype", "kv_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
def test_mixed_batch_matches_reference(
    use_isa: Callable[[str], str], isa: str, dtype: torch.dtype, kv_dtype: torch.dtype, head_size: int
) -> None:
    use_isa(isa)
    check(MIXED, head_size=head_size, dtype=dtype, kv_dtype=kv_dtype, seed=head_size)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (9, 3), (16, 2), (8, 1), (32, 8)])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_gqa_and_block_sizes(
    use_isa: Callable[[str], str], isa: str, heads: int, kv_heads: int, block_size: int
) -> None:
    use_isa(isa)
    check(MIXED, heads=heads, kv_heads=kv_heads, block_size=block_size, dtype=torch.bfloat16)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("split", [1, 7, 64, 100])
def test_split_keys_are_merged_exactly(use_isa: Callable[[str], str], isa: str, split: int) -> None:
    """Forced key splits (flash-decoding) give the unsplit answer, prefill tiles included."""
    use_isa(isa)
    check(([1, 1, 33], [700, 2, 90]), split=split, heads=8, kv_heads=2)


def test_one_long_row_is_split_automatically() -> None:
    """A single 3k-token decode is cut into several items (more than threads) and still matches."""
    check(([1], [3000]), heads=9, kv_heads=3, dtype=torch.bfloat16)


def test_strided_query_and_explicit_scale() -> None:
    """A transposed [1, H, T, D] query view and a scale far from head_size ** -0.5."""
    b = make_paged_batch(*MIXED, heads=4, kv_heads=2)
    view = b.query.transpose(0, 1).contiguous().transpose(0, 1)
    assert not view.is_contiguous()
    md = b.metadata
    got = ops.attention(view, b.cache, md.query_start_loc, md.seq_lens, md.block_table, 0.3)
    spec = type(b.spec)(4, 2, 64, scale=0.3)
    want = ReferenceBackend("cpu").attention(b.query, b.standard, md, spec)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_padding_tokens_get_zeros() -> None:
    """Tokens after the last row (graph-style padding) come back as zeros, never garbage."""
    b = make_paged_batch([1, 3], [5, 3])
    padded = torch.cat([b.query, torch.randn(4, 6, 64)])
    md = b.metadata
    out = ops.attention(padded, b.cache, md.query_start_loc, md.seq_lens, md.block_table, 0.125)
    assert torch.equal(out[4:], torch.zeros(4, 6, 64))
