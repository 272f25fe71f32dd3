"""The suite's own building blocks: the grid's new sweeps, strided layouts, independent copies, integrity checks."""

from __future__ import annotations

import pytest
import torch

from paged_conformance.batch import independent_pairs, make_batch, row_shapes
from paged_conformance.grid import LONG_CONTEXT, SCALE, Case, attention_cases, dtype_name
from paged_conformance.integrity import assert_unchanged, snapshot
from paged_conformance.layouts import strided
from paged_core.api import BackendCapabilities, build_attention_metadata

CAPS = BackendCapabilities(
    dtypes=frozenset({torch.float32, torch.bfloat16}),
    block_sizes=(16, 32),
    kv_cache_dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}),
)


@pytest.mark.parametrize("grid", ["quick", "full"])
def test_grid_has_every_new_sweep(grid: str) -> None:
    cases = attention_cases(CAPS, grid)
    kinds = {c.kind for c in cases}
    assert {"wide", "long_context"} <= kinds
    assert {1, 2, 8} <= {c.num_kv_heads for c in cases}
    assert any(c.scale == SCALE for c in cases)
    assert {"fused", "head_major"} <= {c.layout for c in cases}
    kv = {(dtype_name(c.dtype), dtype_name(c.cache_dtype)) for c in cases if c.cache_dtype != c.dtype}
    assert ("float32", "float16") in kv and ("float32", "bfloat16") in kv
    assert all(c.cache_dtype in CAPS.effective_kv_cache_dtypes for c in cases)
    assert len({c.id for c in cases}) == len(cases)


def test_no_kv_dtype_cases_without_other_declared_kv_dtypes() -> None:
    caps = BackendCapabilities(dtypes=frozenset({torch.float32}), block_sizes=(16,))
    assert all(c.kv_dtype is None for c in attention_cases(caps, "full"))


def test_wide_and_long_rows() -> None:
    wide = row_shapes("wide", 51, 16)
    decodes = [r for r in wide if r[0] == 1]
    assert 12 <= len(decodes) <= 17 and len(wide) - len(decodes) == 2 and wide[: len(decodes)] == decodes
    long = row_shapes("long_context", LONG_CONTEXT, 16)
    assert max(s for _, s in long) >= 1000 and any(q > 1 and s - q > 256 for q, s in long)


@pytest.mark.parametrize("layout", ["fused", "head_major"])
def test_strided_layouts_keep_values_not_contiguity(layout: str) -> None:
    q, k = torch.randn(5, 8, 16), torch.randn(5, 2, 16)
    sq, sk = strided(layout, q, k)
    assert torch.equal(sq, q) and torch.equal(sk, k)
    assert not sq.is_contiguous() and not sk.is_contiguous()
    if layout == "head_major":
        with pytest.raises(RuntimeError):
            sk.view(5, -1)  # code that assumes contiguous inputs breaks here


def test_kv_dtype_batches_are_exact_in_the_cache_dtype() -> None:
    batch = make_batch(Case(torch.float32, 64, 16, 1, "mixed", "block+1", kv_dtype=torch.bfloat16))
    assert batch.kv_dtype == torch.bfloat16
    assert all(torch.equal(k, k.to(torch.bfloat16).float()) for k in batch.keys)


def test_layers_share_tables_but_not_values() -> None:
    case = Case(torch.float32, 64, 16, 1, "mixed", "block+1")
    a, b = make_batch(case, layer=0), make_batch(case, layer=1)
    assert a.block_tables == b.block_tables and not torch.equal(a.keys[0], b.keys[0])
    assert len(a.spare_blocks()) >= 4 and 0 not in a.spare_blocks()


def test_independent_pairs() -> None:
    assert independent_pairs([(1, 2), (1, 3), (4, 5)]) == [(1, 2), (1, 3), (4, 5)]
    with pytest.raises(ValueError, match="destinations also sources"):
        independent_pairs([(1, 2), (2, 3)])
    with pytest.raises(ValueError, match="destinations twice"):
        independent_pairs([(1, 2), (3, 2)])


def test_metadata_snapshot_sees_in_place_edits() -> None:
    md = build_attention_metadata([1, 3], [5, 3], [[1], [2]], 16)
    before = snapshot(md)
    assert_unchanged(md, before, "nothing")
    md.slot_mapping.clamp_(min=0)
    assert_unchanged(md, before, "a no-op clamp")  # no padding, nothing changed
    md.seq_lens[0] += 1
    with pytest.raises(AssertionError, match=r"modified metadata\.seq_lens"):
        assert_unchanged(md, before, "a kernel")
