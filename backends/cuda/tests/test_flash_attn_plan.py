"""flash-attn's arguments as the plan gives them, run through the model of flash-attn's paged calls, vs the reference.

Everything runs on CPU tensors in fp32: the plan is pure torch and the model computes what
``flash_attn_with_kvcache`` and ``flash_attn_varlen_func(..., block_table=)`` compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from paged_backend_cuda.flash_attn_model import kvcache_paged_attention, varlen_paged_attention
from paged_backend_cuda.flash_attn_plan import FlashAttnPlan, plan_flash_attn, window_size
from paged_core.api import AttentionSpec, PagedError, build_attention_metadata
from paged_core.testing import ReferenceBackend

from .batches import Batch, make_batch

TOL = {"atol": 2e-5, "rtol": 1e-5}


def model_attention(plan: FlashAttnPlan, query: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """What the backend's ``attention`` asks of flash-attn."""
    if not plan.decode_only:
        varlen: Any = plan.varlen_kwargs()
        return varlen_paged_attention(query, cache[0], cache[1], **varlen)
    rows = plan.num_rows
    out = torch.zeros_like(query)
    kwargs: Any = plan.kvcache_kwargs()
    out[:rows] = kvcache_paged_attention(query[:rows].unsqueeze(1), cache[0], cache[1], **kwargs).squeeze(1)
    return out


def reference(batch: Batch) -> torch.Tensor:
    return ReferenceBackend().attention(batch.query, batch.cache, batch.metadata, batch.spec)


def spec(heads: int = 4, kv_heads: int = 4, head_size: int = 32, **kwargs: Any) -> AttentionSpec:
    return AttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, **kwargs)


CASES = {
    "decode-only": ([(1, 5), (1, 300), (1, 256)], 256, spec(4, 1)),
    "prefill-only": ([(40, 40), (7, 7)], 256, spec()),
    "mixed-prefix-gqa8": ([(1, 513), (1, 1), (30, 300), (12, 260)], 256, spec(8, 1)),
    "block-boundaries-256": ([(1, 256), (1, 257), (3, 512), (2, 513)], 256, spec(2, 2, 64)),
    "block-boundaries-512": ([(1, 512), (1, 513), (9, 520)], 512, spec(4, 2)),
    "window-decode": ([(1, 300), (1, 20), (1, 49), (1, 50)], 256, spec(4, 2, sliding_window=50)),
    "window-mixed": ([(1, 300), (64, 270), (5, 5)], 256, spec(4, 1, sliding_window=33)),
    "window-1": ([(1, 9), (4, 9)], 256, spec(2, 1, sliding_window=1)),
    "soft-cap-and-scale": ([(1, 280), (1, 7), (17, 30)], 256, spec(8, 2, scale=0.4, logits_soft_cap=2.5)),
    "decode-soft-cap": ([(1, 280), (1, 7)], 256, spec(8, 2, scale=0.4, logits_soft_cap=2.5)),
    "all-features-512": ([(1, 600), (20, 530)], 512, spec(8, 2, 128, sliding_window=100, logits_soft_cap=5.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_model_over_plan_matches_reference(name: str) -> None:
    """Decode-only (kv-cache call), prefill-only and mixed (varlen call), cached prefixes, blocks, window, cap, GQA."""
    rows, block_size, layer = CASES[name]
    batch = make_batch(rows, block_size, layer)
    plan = plan_flash_attn(batch.metadata, layer)
    assert plan.decode_only == all(q == 1 for q, _ in rows)
    torch.testing.assert_close(model_attention(plan, batch.query, batch.cache), reference(batch), **TOL)


@pytest.mark.parametrize("name", ["decode-only", "window-decode", "decode-soft-cap"])
def test_decode_steps_also_run_through_varlen(name: str) -> None:
    """The varlen form handles decode-only steps too (query length 1: flash-attn turns causal off, same result)."""
    rows, block_size, layer = CASES[name]
    batch = make_batch(rows, block_size, layer)
    plan = plan_flash_attn(batch.metadata, layer, force_varlen=True)
    assert not plan.decode_only and plan.max_seqlen_q == 1
    torch.testing.assert_close(model_attention(plan, batch.query, batch.cache), reference(batch), **TOL)


def test_arguments_follow_the_contract() -> None:
    """cu_seqlens_q is query_start_loc, cu_seqlens_k the running sum of seq_lens, the block table is passed as is."""
    layer = spec(sliding_window=7, logits_soft_cap=3.0, scale=0.2)
    batch = make_batch([(1, 300), (6, 20)], 256, layer)
    plan = plan_flash_attn(batch.metadata, layer)
    assert plan.cu_seqlens_q is batch.metadata.query_start_loc and plan.block_table is batch.metadata.block_table
    assert plan.cu_seqlens_k is not None and plan.cu_seqlens_k.tolist() == [0, 300, 320]
    assert plan.cu_seqlens_k.dtype == torch.int32
    assert (plan.max_seqlen_q, plan.max_seqlen_k) == (6, 300)
    assert (plan.window_size, plan.softcap, plan.softmax_scale) == ((6, 0), 3.0, 0.2)
    assert window_size(spec()) == (-1, -1) and plan_flash_attn(batch.metadata, spec()).softcap == 0.0


def test_graph_padded_decode() -> None:
    """A padded decode graph (padding rows of one token in the null block): the live rows are exact."""
    batch = make_batch([(1, 20), (1, 300), (1, 257)], 256, spec(4, 2, sliding_window=40))
    md, n = batch.metadata, 6
    tables = [row[row > 0].tolist() for row in md.block_table] + [[0]] * (n - md.num_reqs)
    static = build_attention_metadata(
        [1] * n, md.seq_lens.tolist() + [1] * 3, tables, 256, max_blocks_per_seq=md.block_table.shape[1]
    )
    query = torch.cat([batch.query, torch.zeros(3, 4, 32)])
    for force_varlen in (False, True):
        plan = plan_flash_attn(static, batch.spec, force_varlen=force_varlen)
        out = model_attention(plan, query, batch.cache)
        torch.testing.assert_close(out[:3], reference(batch), **TOL)


def test_window_off_by_one_is_caught() -> None:
    """Mutation check: ``(W, 0)`` instead of ``(W - 1, 0)`` lets one key too many in."""
    layer = spec(sliding_window=5)
    batch = make_batch([(1, 30), (8, 20)], 256, layer)
    plan = plan_flash_attn(batch.metadata, layer)
    wide = dataclasses.replace(plan, window_size=(5, 0))
    assert not torch.allclose(model_attention(wide, batch.query, batch.cache), reference(batch), **TOL)


def test_key_lengths_off_by_one_are_caught() -> None:
    """Mutation check: one key more or less in ``cu_seqlens_k`` / ``cache_seqlens`` changes the result."""
    batch = make_batch([(1, 30), (1, 257), (8, 20)], 256, spec())
    plan = plan_flash_attn(batch.metadata, batch.spec)
    assert plan.cu_seqlens_k is not None
    shifted = plan.cu_seqlens_k.clone()
    shifted[2:] += 1  # row 1 gets key 257, past its length
    mutated = dataclasses.replace(plan, cu_seqlens_k=shifted, max_seqlen_k=plan.max_seqlen_k + 1)
    out = model_attention(mutated, batch.query, batch.cache)
    assert not torch.allclose(out, reference(batch), **TOL)
    decode = make_batch([(1, 30), (1, 257)], 256, spec())
    decode_plan = plan_flash_attn(decode.metadata, decode.spec)
    shorter = dataclasses.replace(decode_plan, cache_seqlens=decode_plan.cache_seqlens - 1)
    assert not torch.allclose(model_attention(shorter, decode.query, decode.cache), reference(decode), **TOL)


def test_model_refuses_too_small_bounds() -> None:
    """flash-attn sizes its grid and splits from max_seqlen_q/k; the model refuses bounds a row exceeds."""
    batch = make_batch([(1, 30), (8, 20)], 256, spec())
    plan = plan_flash_attn(batch.metadata, batch.spec)
    with pytest.raises(ValueError, match="exceed max_seqlen"):
        model_attention(dataclasses.replace(plan, max_seqlen_k=29), batch.query, batch.cache)


class HostReads(TorchFunctionMode):
    """Records host reads (``tolist``, ``item``, ``int``, ...) of some tensors or of anything computed from them."""

    FORBIDDEN = frozenset({"tolist", "item", "cpu", "numpy", "to", "__bool__", "__int__", "__float__", "__index__"})

    def __init__(self, *watched: torch.Tensor) -> None:
        super().__init__()
        self.tainted = list(watched)
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


def test_plan_never_reads_metadata_on_the_host() -> None:
    """No host read of any metadata tensor: the plan can be built inside a captured step."""
    batch = make_batch([(1, 300), (6, 20)], 256, spec(sliding_window=9))
    md = batch.metadata
    with HostReads(md.query_start_loc, md.seq_lens, md.block_table, md.slot_mapping) as mode:
        plan = plan_flash_attn(md, batch.spec)
    assert mode.reads == []
    torch.testing.assert_close(model_attention(plan, batch.query, batch.cache), reference(batch), **TOL)


def test_empty_step_is_refused() -> None:
    """A step without rows has nothing to plan."""
    batch = make_batch([(1, 3)], 256, spec())
    empty = dataclasses.replace(batch.metadata, seq_lens=batch.metadata.seq_lens[:0], num_decodes=0)
    with pytest.raises(PagedError, match="empty step"):
        plan_flash_attn(empty, batch.spec)
