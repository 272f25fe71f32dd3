"""Test batches for the library tiers' planners: every row's keys and values already in a shuffled paged cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_core.api import AttentionMetadata, AttentionSpec, build_attention_metadata


@dataclass(frozen=True)
class Batch:
    """A step whose cache already holds every row's keys and values, in shuffled blocks."""

    spec: AttentionSpec
    metadata: AttentionMetadata
    cache: torch.Tensor
    query: torch.Tensor


def make_batch(rows: list[tuple[int, int]], block_size: int, spec: AttentionSpec, seed: int = 0) -> Batch:
    """``rows`` are ``(query_len, seq_len)``, decodes first; each block table has one unused column more."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-seq // block_size) for _, seq in rows]
    num_blocks = sum(needed) + 3
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 stays the null block
    tables = [free[sum(needed[:b]) : sum(needed[: b + 1])] for b in range(len(rows))]
    metadata = build_attention_metadata(
        [q for q, _ in rows], [s for _, s in rows], tables, block_size, max_blocks_per_seq=max(needed) + 1
    )
    cache = torch.randn(2, num_blocks, block_size, spec.num_kv_heads, spec.head_size, generator=gen)
    query = 2 * torch.randn(metadata.num_tokens, spec.num_heads, spec.head_size, generator=gen)
    return Batch(spec, metadata, cache, query)
