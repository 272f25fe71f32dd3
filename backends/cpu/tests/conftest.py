"""Shared fixtures: random paged batches and an ISA switch that is always restored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from paged_backend_cpu import layout, ops
from paged_core.api import AttentionMetadata, AttentionSpec, build_attention_metadata


@dataclass
class PagedBatch:
    """A batch whose KV cache already holds every row's context (blocks shuffled across the cache).

    ``cache`` is in the cpu backend's layout; ``standard`` holds the same keys and values in the
    core's default layout, for the reference backend.
    """

    spec: AttentionSpec
    metadata: AttentionMetadata
    cache: torch.Tensor
    query: torch.Tensor
    standard: torch.Tensor


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
) -> PagedBatch:
    """Random queries and a random cache; row ``b`` owns ``ceil(seq_lens[b] / block_size)`` shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    spec = AttentionSpec(heads, kv_heads, head_size)
    counts = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(counts) + 2  # block 0 stays the unused null block, one spare at the end
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables, start = [], 0
    for c in counts:
        tables.append(ids[start : start + c])
        start += c
    md = build_attention_metadata(query_lens, seq_lens, tables, block_size)
    standard = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen).to(kv_dtype or dtype)
    query = torch.randn(sum(query_lens), heads, head_size, generator=gen).to(dtype)
    return PagedBatch(spec, md, layout.from_standard(standard), query, standard)


@pytest.fixture
def use_isa() -> Iterator[object]:
    """``use_isa(name)`` switches the kernel variant for one test; the previous one comes back afterwards."""
    before = ops.isa()
    yield ops.set_isa
    ops.set_isa(before)
