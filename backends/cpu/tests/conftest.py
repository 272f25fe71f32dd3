"""Shared fixtures: random paged batches and an ISA switch that is always restored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from paged_backend_cpu import layout, ops
from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    build_attention_metadata,
    dequantize_kv,
    is_quantized_kv,
    quantize_kv,
)

GARBAGE_BYTES = (0xFF, 0x7F)
"""Byte patterns of the garbage blocks: NaN in every KV dtype; huge (float32, bfloat16) or NaN (the others)."""


@dataclass
class PagedBatch:
    """A batch whose KV cache already holds every row's context (blocks shuffled across the cache).

    ``cache`` is in the cpu backend's layout; ``standard`` holds the same keys and values in the
    core's default layout (quantized ones as :func:`paged_core.api.quantize_kv` stores them).
    """

    spec: AttentionSpec
    metadata: AttentionMetadata
    cache: torch.Tensor
    query: torch.Tensor
    standard: torch.Tensor

    @property
    def reference_cache(self) -> torch.Tensor:
        """The cache the reference backend reads: ``standard``, dequantized to float32 when quantized."""
        return dequantize_kv(self.standard) if is_quantized_kv(self.standard.dtype) else self.standard


def fill_garbage(cache: torch.Tensor, block: int, pattern: int) -> None:
    """Every byte of ``block`` (keys, values and any scales) set to ``pattern``, in either layout."""
    cache.view(torch.uint8)[:, block] = pattern


def stale_table(
    tables: list[list[int]], query_lens: list[int], seq_lens: list[int], window: int, block_size: int, garbage: int
) -> None:
    """In place: each row's entries for blocks wholly before its first query's window become 0 (the null block)
    or ``garbage`` (a block of another request), alternately, as a sliding layer's table may hold them."""
    for table, q_len, seq_len in zip(tables, query_lens, seq_lens, strict=True):
        first_visible = max(0, seq_len - q_len - window + 1)
        for i in range(first_visible // block_size):
            table[i] = 0 if i % 2 == 0 else garbage


def make_paged_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    heads: int = 6,
    kv_heads: int = 2,
    head_size: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    kv_dtype: torch.dtype | None = None,
    seed: int = 0,
    window: int | None = None,
    soft_cap: float | None = None,
) -> PagedBatch:
    """Random queries and a random cache; row ``b`` owns ``ceil(seq_lens[b] / block_size)`` shuffled blocks.

    A quantized ``kv_dtype`` stores the random keys and values quantized. With a ``window``, the spec has it,
    and each row's block-table entries wholly before its window point at the null block 0 or at a spare
    block, both filled with garbage (:data:`GARBAGE_BYTES`): a kernel that reads them gives NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    spec = AttentionSpec(heads, kv_heads, head_size, sliding_window=window, logits_soft_cap=soft_cap)
    counts = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(counts) + 2  # block 0 stays the unused null block, one spare at the end
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables, start = [], 0
    for c in counts:
        tables.append(ids[start : start + c])
        start += c
    spare = ids[start]
    if window is not None:
        stale_table(tables, query_lens, seq_lens, window, block_size, spare)
    md = build_attention_metadata(query_lens, seq_lens, tables, block_size)
    kv = kv_dtype or dtype
    values = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen)
    standard = quantize_kv(values, kv) if is_quantized_kv(kv) else values.to(kv)
    if window is not None:
        for block, pattern in zip((0, spare), GARBAGE_BYTES, strict=True):
            fill_garbage(standard, block, pattern)
    query = torch.randn(sum(query_lens), heads, head_size, generator=gen).to(dtype)
    return PagedBatch(spec, md, layout.from_standard(standard), query, standard)


@pytest.fixture
def use_isa() -> Iterator[object]:
    """``use_isa(name)`` switches the kernel variant for one test; the previous one comes back afterwards."""
    before = ops.isa()
    yield ops.set_isa
    ops.set_isa(before)
