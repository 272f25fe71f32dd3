"""The cpu backend's in-place token bitmask against the contract's reference (``FusedOps().apply_token_bitmask``): the
same -inf positions and untouched values, for random and word-uniform masks, every logits dtype, row subsets in
any order, and vocabularies wider or narrower than the mask; bad shapes are refused by name."""

from __future__ import annotations

import pytest
import torch

from paged_backend_cpu.fused import CpuFusedOps
from paged_core.api import FusedOps

apply_bitmask = FusedOps().apply_token_bitmask


def bitmask_width(vocab: int) -> int:
    return (vocab + 31) // 32


def _mask(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Words of every kind: all allowed, none allowed, and mixed bits."""
    words = bitmask_width(vocab)
    mixed = torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    kind = torch.randint(0, 3, (rows, words), generator=gen)
    return torch.where(kind == 0, torch.full_like(mixed, -1), torch.where(kind == 1, torch.zeros_like(mixed), mixed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("vocab", "mask_vocab"), [(49152, 49152), (1000, 1000), (1030, 1000), (1000, 1100), (7, 7)])
def test_matches_the_reference(dtype: torch.dtype, vocab: int, mask_vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab + mask_vocab)
    logits = torch.randn(9, vocab, generator=gen).to(dtype)
    rows = [7, 0, 3, 8, 5]
    bitmask = _mask(len(rows), mask_vocab, gen)
    want, got = logits.clone(), logits.clone()
    apply_bitmask(want, bitmask, rows)
    CpuFusedOps().apply_token_bitmask(got, bitmask, rows)
    assert torch.equal(got, want)
    assert torch.isinf(got).any() and torch.equal(got[[1, 2, 4, 6]], logits[[1, 2, 4, 6]])


def test_strided_rows_and_no_rows() -> None:
    base = torch.randn(4, 2 * 64)
    logits = base[:, :64]  # rows 128 apart, unit stride along the vocabulary
    bitmask = torch.tensor([[0x0F0F0F0F, -1], [0, 1]], dtype=torch.int32)
    want = logits.clone()
    apply_bitmask(want, bitmask, [2, 1])
    CpuFusedOps().apply_token_bitmask(logits, bitmask, [2, 1])
    assert torch.equal(logits, want) and torch.isinf(base[:, :64]).sum() > 0 and not torch.isinf(base[:, 64:]).any()
    CpuFusedOps().apply_token_bitmask(logits, bitmask[:0], [])


def test_bad_input_is_refused_by_name() -> None:
    ops = CpuFusedOps()
    logits = torch.zeros(2, 64)
    with pytest.raises(RuntimeError, match="outside the logits"):
        ops.apply_token_bitmask(logits, torch.zeros(1, 2, dtype=torch.int32), [5])
    with pytest.raises(RuntimeError, match="rows but the bitmask has"):
        ops.apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32), [0])
    with pytest.raises(RuntimeError, match="bitmask must be a contiguous int32"):
        ops.apply_token_bitmask(logits, torch.zeros(1, 2, dtype=torch.int64), [0])
    with pytest.raises(RuntimeError, match="unit stride"):
        ops.apply_token_bitmask(logits.t(), torch.zeros(1, 1, dtype=torch.int32), [0])
