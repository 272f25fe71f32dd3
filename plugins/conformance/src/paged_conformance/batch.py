"""Synthetic batches: row shapes per batch kind, scattered block tables, seeded tensors.

Blocks are handed out in a random order (never block 0, the null block), so a
backend that ignores the block table, or indexes it wrongly, reads the wrong
keys. Query and key magnitudes make attention peaked enough that a single
wrongly visible key moves the output well past the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from paged_conformance.grid import KINDS, Case
from paged_core.api import AttentionMetadata, AttentionSpec, build_attention_metadata, is_quantized_kv

SPARE_BLOCKS = 4
"""Blocks no row uses, so stray writes land somewhere a later read can notice.

The harness reads them back through attention after every step (see
:func:`paged_conformance.integrity.assert_spare_blocks_untouched`); the copy
test uses them as destinations.
"""


def row_shapes(kind: str, tokens: int, block_size: int) -> list[tuple[int, int]]:
    """``(query_len, seq_len)`` per row for a batch kind, decode rows first."""
    n, b = tokens, block_size
    if kind == "decode":
        return [(1, n), (1, n + 1), (1, max(1, n - 1))]
    if kind == "prefill":
        return [(n, n), (n + 1, n + 1)]
    if kind == "mixed":
        p = max(n, 2)
        return [(1, n), (1, n + 1), (p, p), (3, b + 3)]
    if kind == "prefix":
        cached = b * (2 if n > b else 1)
        # Cached whole blocks, as a prefix-cache hit leaves them, and one chunk continuing mid-block.
        return [(n, cached + n), (n + 1, b + n + 1), (n, cached + 1 + n)]
    if kind == "wide":
        # 14 decodes whose lengths straddle block edges (row index >= 4 is where per-row work lists go wrong).
        lens = [1, 2, b - 1, b, b + 1, 2 * b - 1, 2 * b, 2 * b + 1, n, n + 1, 3, b + 2, n - 1, 5]
        return [(1, max(1, s)) for s in lens] + [(max(n, 2), max(n, 2)), (3, b + 3)]
    if kind == "long_context":
        # A long decode, a short one, and a chunk of a long prompt continuing mid-block past a long context.
        return [(1, n), (1, b + 1), (2 * b + 3, n // 2 + 2 * b + 3)]
    raise ValueError(f"unknown batch kind {kind!r} (known: {', '.join(KINDS)})")


@dataclass
class Batch:
    """Per-row tensors of one step plus the cached context that precedes it."""

    spec: AttentionSpec
    dtype: torch.dtype
    kv_dtype: torch.dtype
    """The KV cache's dtype for the backend under test. Keys and values are exactly representable in a float one;
    a quantized one (int8, fp8) stores them by the rule of :mod:`paged_core.contract.kv_quant`, which the oracle
    applies too (:func:`paged_conformance.oracle.stored_values`)."""
    layout: str
    """How q/k/v are handed to the backend under test (see :data:`paged_conformance.grid.LAYOUTS`)."""
    block_size: int
    num_blocks: int
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    queries: list[torch.Tensor]
    """Row ``b``: ``[query_len, num_heads, head_size]`` on the CPU."""
    keys: list[torch.Tensor]
    """Row ``b``: ``[seq_len, num_kv_heads, head_size]`` (context, then this step's tokens)."""
    values: list[torch.Tensor]

    @property
    def max_blocks(self) -> int:
        return max(len(t) for t in self.block_tables)

    def spare_blocks(self) -> list[int]:
        """Blocks no row's table uses, the null block 0 excluded."""
        used = {b for t in self.block_tables for b in t}
        return [b for b in range(1, self.num_blocks) if b not in used]

    def context_lens(self) -> list[int]:
        return [s - q for q, s in zip(self.query_lens, self.seq_lens, strict=True)]

    def metadata(self, device: torch.device, pad: int = 0) -> AttentionMetadata:
        """The step's metadata, with ``pad`` trailing padding tokens (slot -1)."""
        md = build_attention_metadata(
            self.query_lens, self.seq_lens, self.block_tables, self.block_size, device, self.max_blocks
        )
        if pad:
            fill = torch.full((pad,), -1, dtype=torch.int64, device=device)
            md = dataclasses.replace(md, slot_mapping=torch.cat([md.slot_mapping, fill]))
        return md

    def step_tensors(self, device: torch.device, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This step's ``query, key, value`` flattened to ``[T, heads, head_size]``; padding rows are noise."""
        ctx = self.context_lens()
        q = torch.cat(self.queries)
        k = torch.cat([k[c:] for k, c in zip(self.keys, ctx, strict=True)])
        v = torch.cat([v[c:] for v, c in zip(self.values, ctx, strict=True)])
        if pad:
            gen = torch.Generator().manual_seed(pad)
            q, k, v = (
                torch.cat([t, 100 * torch.randn((pad, *t.shape[1:]), generator=gen).to(t.dtype)]) for t in (q, k, v)
            )
        return q.to(device), k.to(device), v.to(device)

    def context_step(self, device: torch.device) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor] | None:
        """A write-only step storing every row's cached context, or None when nothing is cached."""
        rows = [b for b, c in enumerate(self.context_lens()) if c > 0]
        if not rows:
            return None
        ctx = self.context_lens()
        rows.sort(key=lambda b: ctx[b] != 1)  # one-token rows count as decodes and go first
        md = build_attention_metadata(
            [ctx[b] for b in rows],
            [ctx[b] for b in rows],
            [self.block_tables[b] for b in rows],
            self.block_size,
            device,
            self.max_blocks,
        )
        k = torch.cat([self.keys[b][: ctx[b]] for b in rows]).to(device)
        v = torch.cat([self.values[b][: ctx[b]] for b in rows]).to(device)
        return md, k, v


def case_spec(case: Case) -> AttentionSpec:
    """The layer shape a case describes."""
    return AttentionSpec(case.num_heads, case.num_kv_heads, case.head_size, scale=case.scale)


def make_batch(
    case: Case,
    rows: list[tuple[int, int]] | None = None,
    spec: AttentionSpec | None = None,
    extra_blocks: int = SPARE_BLOCKS,
    layer: int = 0,
) -> Batch:
    """Build the seeded batch for ``case`` (``rows`` overrides the kind's row shapes).

    Every ``layer`` shares the row shapes and block tables but gets its own
    queries, keys and values, as the layers of one model step do.
    """
    shapes = rows if rows is not None else row_shapes(case.kind, case.tokens, case.block_size)
    spec = spec or case_spec(case)
    gen = torch.Generator().manual_seed(case.seed)
    bs = case.block_size
    needed = [math.ceil(s / bs) for _, s in shapes]
    num_blocks = 1 + sum(needed) + extra_blocks
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables: list[list[int]] = []
    for n in needed:
        tables.append(order[:n])
        order = order[n:]

    gen = torch.Generator().manual_seed(case.seed + 7919 * (layer + 1))
    kv_dtype = case.cache_dtype

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(shape, generator=gen)).to(case.dtype)

    def stored(t: torch.Tensor) -> torch.Tensor:
        # Round through a float cache dtype, so storing loses nothing and the oracle can keep the compute dtype. A
        # quantized cache rounds each vector by its own scale: the oracle quantizes the same values by the rule.
        return t if is_quantized_kv(kv_dtype) else t.to(kv_dtype).to(case.dtype)

    # Queries scaled up so softmax is peaked: a wrongly visible key is plainly visible. With an explicit
    # spec.scale the logits keep the same spread as under the default one.
    q_scale = 2.0 * spec.head_size**-0.5 / spec.softmax_scale
    queries = [rand(q, spec.num_heads, spec.head_size, scale=q_scale) for q, _ in shapes]
    keys = [stored(rand(s, spec.num_kv_heads, spec.head_size)) for _, s in shapes]
    values = [stored(rand(s, spec.num_kv_heads, spec.head_size)) for _, s in shapes]
    return Batch(
        spec=spec,
        dtype=case.dtype,
        kv_dtype=kv_dtype,
        layout=case.layout,
        block_size=bs,
        num_blocks=num_blocks,
        query_lens=[q for q, _ in shapes],
        seq_lens=[s for _, s in shapes],
        block_tables=tables,
        queries=queries,
        keys=keys,
        values=values,
    )


def independent_pairs(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``pairs`` unchanged if they obey the contract (no destination twice, none also a source), else ValueError.

    A backend may run the block copies of one call in any order or in
    parallel, so the suite must never hand it a chain such as ``(1, 2), (2, 3)``.
    """
    dsts = [d for _, d in pairs]
    twice = sorted({d for d in dsts if dsts.count(d) > 1})
    chained = sorted({s for s, _ in pairs} & set(dsts))
    if twice or chained:
        raise ValueError(
            f"block copies are not independent: destinations twice {twice}, destinations also sources {chained}"
        )
    return pairs
