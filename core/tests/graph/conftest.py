"""Test backends whose attention is vectorized (capturable: no host reads), plus batch builders."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    GraphSupport,
    build_attention_metadata,
)

SPEC = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=8)
BLOCK_SIZE = 4
MAX_BLOCKS = 6
NUM_BLOCKS = 64


class VectorBackend(AttentionBackend):
    """Paged attention over every token at once: gathers each token's row through the block table."""

    name = "vector-test"
    api_version = 1
    support = GraphSupport.UNIFORM_DECODE

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        self.prepared: list[AttentionMetadata] = []

    @classmethod
    def availability(cls) -> Availability:
        return Availability(available=True)

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=frozenset({torch.float32}), block_sizes=(BLOCK_SIZE,), graph_support=cls.support
        )

    def prepare(self, metadata: AttentionMetadata) -> None:
        self.prepared.append(metadata)

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        # Padding slots (-1) rewrite slot 0's current value onto itself: no host-side filtering needed.
        slots = metadata.slot_mapping
        valid = (slots >= 0)[:, None, None]
        idx = slots.clamp(min=0)
        flat = kv_cache.view(2, -1, kv_cache.shape[3], kv_cache.shape[4])
        flat[0].index_put_((idx,), torch.where(valid, key, flat[0][idx]))
        flat[1].index_put_((idx,), torch.where(valid, value, flat[1][idx]))

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        md = metadata
        return vector_attention(query, kv_cache, md.query_start_loc, md.seq_lens, md.block_table, spec)

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        raise NotImplementedError


class AnyBackend(VectorBackend):
    """The same kernel, declared capturable for any batch."""

    support = GraphSupport.ANY


class NeverBackend(VectorBackend):
    """The same kernel, declared never capturable."""

    support = GraphSupport.NEVER


def vector_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    spec: AttentionSpec,
) -> torch.Tensor:
    """Causal paged attention for every token, using only device-side tensor ops."""
    tokens = query.shape[0]
    qsl = query_start_loc.long()
    tok = torch.arange(tokens, device=query.device)
    row = torch.searchsorted(qsl[1:], tok, right=True).clamp(max=seq_lens.shape[0] - 1)
    q_lens = qsl[1:] - qsl[:-1]
    pos = seq_lens.long()[row] - q_lens[row] + (tok - qsl[row])
    blocks = block_table.long()[row]  # [T, M]
    span = blocks.shape[1] * kv_cache.shape[2]
    keys = kv_cache[0][blocks].reshape(tokens, span, spec.num_kv_heads, spec.head_size)
    values = kv_cache[1][blocks].reshape(tokens, span, spec.num_kv_heads, spec.head_size)
    keys = keys.repeat_interleave(spec.gqa_ratio, dim=2).float()
    values = values.repeat_interleave(spec.gqa_ratio, dim=2).float()
    scores = torch.einsum("thd,tlhd->thl", query.float(), keys) * spec.softmax_scale
    visible = torch.arange(span, device=query.device)[None, :] <= pos[:, None]
    probs = torch.softmax(scores.masked_fill(~visible[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("thl,tlhd->thd", probs, values).to(query.dtype)


def random_batch(
    rng: random.Random, query_lens: list[int], max_seq_len: int = BLOCK_SIZE * MAX_BLOCKS
) -> tuple[AttentionMetadata, dict[str, torch.Tensor]]:
    """A batch with random seq_lens and shuffled, distinct block ids (never the null block 0)."""
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    seq_lens, tables = [], []
    for q in query_lens:
        s = rng.randint(q, max_seq_len)
        seq_lens.append(s)
        tables.append([free.pop() for _ in range(-(-s // BLOCK_SIZE))])
    md = build_attention_metadata(query_lens, seq_lens, tables, BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    t = sum(query_lens)
    inputs = {
        "query": torch.randn(t, SPEC.num_heads, SPEC.head_size, generator=gen),
        "key": torch.randn(t, SPEC.num_kv_heads, SPEC.head_size, generator=gen),
        "value": torch.randn(t, SPEC.num_kv_heads, SPEC.head_size, generator=gen),
    }
    return md, inputs


def new_cache(seed: int = 0) -> torch.Tensor:
    """A random KV cache (random so stale or misdirected reads show up)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, SPEC.num_kv_heads, SPEC.head_size, generator=gen)


@pytest.fixture
def g() -> SimpleNamespace:
    """The helpers above (test modules cannot import conftest under importlib mode)."""
    return SimpleNamespace(
        SPEC=SPEC,
        BLOCK_SIZE=BLOCK_SIZE,
        MAX_BLOCKS=MAX_BLOCKS,
        VectorBackend=VectorBackend,
        AnyBackend=AnyBackend,
        NeverBackend=NeverBackend,
        random_batch=random_batch,
        new_cache=new_cache,
    )
