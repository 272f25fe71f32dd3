"""FlashInfer's arrays as the planner builds them, run through the model of FlashInfer's kernels, vs the reference.

Everything runs on CPU tensors in fp32: the planner is pure torch and the model computes what FlashInfer's
``plan``/``run`` compute, so agreement with the oracle proves the mapping from the batch contract.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from paged_backend_cuda.flashinfer_model import batch_decode_with_paged_kv_cache, batch_prefill_with_paged_kv_cache
from paged_backend_cuda.flashinfer_plan import FlashInferPlanner, FlashInferStep, attention_params
from paged_core.api import AttentionMetadata, AttentionSpec, PagedError, build_attention_metadata
from paged_core.testing import ReferenceBackend

from .batches import Batch, make_batch

TOL = {"atol": 2e-5, "rtol": 1e-5}


def model_attention(
    step: FlashInferStep, query: torch.Tensor, cache: torch.Tensor, spec: AttentionSpec
) -> torch.Tensor:
    """What the backend's ``attention`` asks of FlashInfer: decode rows, then prefill rows, into one output."""
    params = dataclasses.asdict(attention_params(spec))
    pair = (cache[0], cache[1])
    out = torch.zeros_like(query)
    d = step.num_decodes
    if d:
        out[:d] = batch_decode_with_paged_kv_cache(
            query[:d], pair, step.decode_kv_indptr, step.decode_kv_indices, step.decode_kv_last_page_len, **params
        )
    if step.num_prefills:
        start, end = step.prefill_token_start, step.prefill_token_start + step.num_prefill_tokens
        out[start:end] = batch_prefill_with_paged_kv_cache(
            query[start:end],
            pair,
            step.prefill_qo_indptr,
            step.prefill_kv_indptr,
            step.prefill_kv_indices,
            step.prefill_kv_last_page_len,
            causal=True,
            **params,
        )
    return out


def reference(batch: Batch) -> torch.Tensor:
    return ReferenceBackend().attention(batch.query, batch.cache, batch.metadata, batch.spec)


def spec(heads: int = 4, kv_heads: int = 4, head_size: int = 32, **kwargs: Any) -> AttentionSpec:
    return AttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, **kwargs)


CASES = {
    "decode-only": ([(1, 5), (1, 17), (1, 40)], 16, spec()),
    "prefill-only": ([(7, 7), (20, 20)], 16, spec(4, 1)),
    "mixed-gqa8": ([(1, 33), (1, 16), (5, 5), (9, 30)], 32, spec(8, 1)),
    "prefix-cached": ([(6, 70), (3, 64)], 16, spec(2, 2, 64)),
    "block-boundaries": ([(1, 32), (1, 33), (16, 64), (4, 65), (2, 17)], 16, spec(4, 4)),
    "one-block-rows": ([(1, 1), (2, 2), (64, 64)], 64, spec(4, 2)),
    "window": ([(1, 40), (1, 3), (12, 30), (5, 21)], 16, spec(4, 1, sliding_window=6)),
    "window-1": ([(1, 9), (4, 9)], 16, spec(2, 1, sliding_window=1)),
    "soft-cap-and-scale": ([(1, 50), (7, 19)], 32, spec(8, 2, scale=0.4, logits_soft_cap=2.5)),
    "all-features-gqa4": ([(1, 130), (1, 64), (33, 100)], 64, spec(8, 2, 128, sliding_window=37, logits_soft_cap=5.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_model_over_plan_matches_reference(name: str) -> None:
    """Decode-only, prefill-only, mixed, cached prefixes, block boundaries, windows, soft cap, GQA 1/2/4/8."""
    rows, block_size, layer = CASES[name]
    batch = make_batch(rows, block_size, layer)
    step = FlashInferPlanner("cpu").build(batch.metadata)
    torch.testing.assert_close(model_attention(step, batch.query, batch.cache, layer), reference(batch), **TOL)


def test_arrays_follow_the_contract() -> None:
    """Pages = ceil(seq_len / block_size) first table entries; last page holds seq_len % block_size or a full page."""
    batch = make_batch([(1, 16), (1, 17), (3, 3), (2, 33)], 16, spec())
    step = FlashInferPlanner("cpu").build(batch.metadata)
    tables = batch.metadata.block_table
    assert step.kv_indptr.tolist() == [0, 1, 3, 4, 7]
    assert step.kv_last_page_len.tolist() == [16, 1, 3, 1]
    expected = [tables[0, :1], tables[1, :2], tables[2, :1], tables[3, :3]]
    assert step.kv_indices.tolist() == torch.cat(expected).tolist()
    assert (step.num_decodes, step.num_prefills, step.num_decode_pages) == (2, 2, 3)
    assert step.prefill_qo_indptr.tolist() == [0, 3, 5]  # relative to the first prefill token
    assert step.prefill_kv_indptr.tolist() == [0, 1, 4]  # zero-based into prefill_kv_indices
    assert step.prefill_kv_indices.tolist() == torch.cat(expected[2:]).tolist()
    assert (step.prefill_token_start, step.num_prefill_tokens) == (2, 5)


def padded(batch: Batch, n: int) -> AttentionMetadata:
    """``batch``'s decode rows padded to ``n`` rows as the graph runner does, with host copies of the live rows only."""
    md = batch.metadata
    live = md.num_reqs
    tables = [row[row > 0].tolist() for row in md.block_table] + [[0]] * (n - live)
    seq_lens = md.seq_lens.tolist() + [1] * (n - live)
    width = md.block_table.shape[1]
    static = build_attention_metadata([1] * n, seq_lens, tables, md.block_size, max_blocks_per_seq=width)
    return dataclasses.replace(
        static, query_start_loc_cpu=md.query_start_loc_cpu, seq_lens_cpu=md.seq_lens_cpu, uniform_query_len=1
    )


def test_graph_padded_decode() -> None:
    """Padded rows get no pages (indptr repeats) and last_page_len 1, read nothing, and the live rows are exact."""
    batch = make_batch([(1, 20), (1, 3), (1, 48)], 16, spec(4, 2))
    static = padded(batch, 6)
    step = FlashInferPlanner("cpu").build(static)
    assert (step.num_rows, step.num_live_rows, step.num_decodes) == (6, 3, 6)
    assert step.kv_indptr.tolist() == [0, 2, 3, 6, 6, 6, 6]
    assert step.kv_last_page_len.tolist() == [4, 3, 16, 1, 1, 1]
    query = torch.cat([batch.query, torch.zeros(3, 4, 32)])
    out = model_attention(step, query, batch.cache, batch.spec)
    torch.testing.assert_close(out[:3], reference(batch), **TOL)
    # What FlashInfer computes for them: an empty row (get_length == 0) writes zeros. The core discards them.
    assert torch.count_nonzero(out[3:]) == 0


def test_missing_host_copies_are_read_back() -> None:
    """Without ``*_cpu`` (a capture-time prepare) the arrays come from the device tensors, the same as with them."""
    batch = make_batch([(1, 20), (4, 9)], 16, spec())
    with_copies = FlashInferPlanner("cpu").build(batch.metadata)
    bare = dataclasses.replace(batch.metadata, query_start_loc_cpu=None, seq_lens_cpu=None)
    without = FlashInferPlanner("cpu").build(bare)
    for name in ("kv_indptr", "kv_last_page_len", "kv_indices", "prefill_qo_indptr", "prefill_kv_indptr"):
        assert torch.equal(getattr(with_copies, name), getattr(without, name)), name


def test_buffers_are_reused_across_steps() -> None:
    """Step after step the arrays are views of the same storage; a step too big for it grows the buffers."""
    planner = FlashInferPlanner("cpu", max_rows=8, max_pages=32)
    first = make_batch([(1, 20), (5, 40)], 16, spec(), seed=1)
    second = make_batch([(1, 3), (1, 70), (2, 2)], 16, spec(), seed=2)
    a = planner.build(first.metadata)
    pointers = {name: getattr(a, name).data_ptr() for name in ("kv_indptr", "kv_last_page_len", "kv_indices")}
    b = planner.build(second.metadata)
    assert {name: getattr(b, name).data_ptr() for name in pointers} == pointers
    torch.testing.assert_close(model_attention(b, second.query, second.cache, second.spec), reference(second), **TOL)
    big = make_batch([(1, 300)] * 3, 16, spec(), seed=3)  # 57 pages > 32
    c = planner.build(big.metadata)
    assert c.kv_indices.data_ptr() != pointers["kv_indices"]
    torch.testing.assert_close(model_attention(c, big.query, big.cache, big.spec), reference(big), **TOL)


@pytest.mark.parametrize("row", [0, 2])
@pytest.mark.parametrize("delta", [-1, 1])
def test_off_by_one_last_page_len_is_caught(row: int, delta: int) -> None:
    """Mutation check: the model really reads the arrays, so one token more or less in a last page shows."""
    batch = make_batch([(1, 21), (1, 9), (6, 30)], 16, spec())
    step = FlashInferPlanner("cpu").build(batch.metadata)
    last = step.kv_last_page_len.clone()
    last[row] += delta
    mutated = dataclasses.replace(step, kv_last_page_len=last)
    out = model_attention(mutated, batch.query, batch.cache, batch.spec)
    assert not torch.allclose(out, reference(batch), **TOL)


def test_window_off_by_one_is_caught() -> None:
    """Mutation check: ``window_left = W`` instead of ``W - 1`` lets one key too many in."""
    layer = spec(sliding_window=5)
    batch = make_batch([(1, 30), (8, 20)], 16, layer)
    step = FlashInferPlanner("cpu").build(batch.metadata)
    wide = spec(sliding_window=6)
    assert not torch.allclose(model_attention(step, batch.query, batch.cache, wide), reference(batch), **TOL)


class HostReads(TorchFunctionMode):
    """Records host reads (``tolist``, ``item``, ``int``, ...) of a tensor or of anything computed from it."""

    FORBIDDEN = frozenset({"tolist", "item", "cpu", "numpy", "to", "__bool__", "__int__", "__float__", "__index__"})

    def __init__(self, watched: torch.Tensor) -> None:
        super().__init__()
        self.tainted = [watched]
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        flat = [*args, *(kwargs or {}).values()]
        if any(any(a is t for t in self.tainted) for a in flat):
            name = getattr(func, "__name__", repr(func))
            if name in self.FORBIDDEN:
                self.reads.append(name)
            if isinstance(result, torch.Tensor):
                self.tainted.append(result)
        return result


def test_host_reads_sees_derived_reads() -> None:
    """The probe itself: a read through an index or a view is caught."""
    table = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    with HostReads(table) as mode:
        int(table[0, 1])
        table.reshape(-1)[2].item()
    assert mode.reads == ["__int__", "item"]


def test_block_table_is_never_read_on_the_host() -> None:
    """Page ids are gathered on the device: the planner reads only the block table's shape, never its values."""
    batch = make_batch([(1, 20), (5, 40)], 16, spec())
    with HostReads(batch.metadata.block_table) as mode:
        step = FlashInferPlanner("cpu").build(batch.metadata)
    assert mode.reads == []
    torch.testing.assert_close(model_attention(step, batch.query, batch.cache, batch.spec), reference(batch), **TOL)


def test_inconsistent_metadata_is_refused() -> None:
    """A table narrower than a row's pages, and padded host copies beside prefill rows, are refused by name."""
    batch = make_batch([(1, 20), (5, 40)], 16, spec())
    narrow = dataclasses.replace(batch.metadata, block_table=batch.metadata.block_table[:, :2])
    with pytest.raises(PagedError, match="needs 3 blocks, table has 2"):
        FlashInferPlanner("cpu").build(narrow)
    short = dataclasses.replace(
        batch.metadata,
        query_start_loc_cpu=batch.metadata.query_start_loc_cpu[:2],
        seq_lens_cpu=batch.metadata.seq_lens_cpu[:1],
    )
    with pytest.raises(PagedError, match="only valid for pure-decode steps"):
        FlashInferPlanner("cpu").build(short)
