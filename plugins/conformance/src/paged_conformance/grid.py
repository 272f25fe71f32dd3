"""The test grid: which configurations the suite runs, given what a backend declares.

The full cartesian product of every axis is far too large for a CPU run, so a
grid is a union of sweeps: every batch kind and length edge case at each
declared dtype and block size, plus head-size and GQA sweeps on one mixed
batch. Only declared values are generated; an undeclared one is N/A, never a
failure.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from paged_core.api import BackendCapabilities

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""Every dtype the suite knows how to test."""
HEAD_SIZES: tuple[int, ...] = (64, 80, 128, 256)
GQA_RATIOS: tuple[int, ...] = (1, 4, 8)
KINDS: tuple[str, ...] = ("decode", "prefill", "mixed", "prefix")
"""Batch kinds: pure decode, pure prefill, decodes then prefills, prefill over cached blocks."""
LENGTHS: tuple[str, ...] = ("1", "block-1", "block", "block+1", "long")
GRIDS: tuple[str, ...] = ("quick", "full")
NUM_KV_HEADS = 2
"""Two KV heads, so a wrong query-to-KV head mapping cannot hide behind a single head."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def length_value(label: str, block_size: int) -> int:
    """The token count a length label means at ``block_size`` ("long" is 3 blocks + 3, at least 35)."""
    table = {
        "1": 1,
        "block-1": block_size - 1,
        "block": block_size,
        "block+1": block_size + 1,
        "long": max(3 * block_size + 3, 35),
    }
    if label not in table:
        raise ValueError(f"unknown length label {label!r} (known: {', '.join(LENGTHS)})")
    return table[label]


@dataclass(frozen=True)
class Case:
    """One attention configuration and batch shape to compare against the oracle."""

    dtype: torch.dtype
    head_size: int
    block_size: int
    gqa: int
    kind: str
    length: str

    @property
    def id(self) -> str:
        """Readable pytest id: ``dtype-head-block-gqa-kind-len``."""
        return f"{dtype_name(self.dtype)}-h{self.head_size}-b{self.block_size}-gqa{self.gqa}-{self.kind}-{self.length}"

    @property
    def num_heads(self) -> int:
        return NUM_KV_HEADS * self.gqa

    @property
    def tokens(self) -> int:
        """The length label resolved at this case's block size."""
        return length_value(self.length, self.block_size)

    @property
    def seed(self) -> int:
        """A stable per-case seed, so a failure reproduces exactly."""
        return zlib.crc32(self.id.encode())

    def capabilities(self) -> list[str]:
        """The capability rows of the report this case counts towards."""
        return [
            f"dtype:{dtype_name(self.dtype)}",
            f"head_size:{self.head_size}",
            f"block_size:{self.block_size}",
            f"gqa:{self.gqa}",
            f"batch:{self.kind}",
        ]


def declared_dtypes(caps: BackendCapabilities) -> list[torch.dtype]:
    """Known dtypes the backend declares, in the suite's order."""
    return [d for d in DTYPES if d in caps.dtypes]


def declared_head_sizes(caps: BackendCapabilities) -> list[int]:
    return [h for h in HEAD_SIZES if caps.head_sizes is None or h in caps.head_sizes]


def declared_gqa(caps: BackendCapabilities) -> list[int]:
    return [g for g in GQA_RATIOS if caps.gqa_ratios is None or g in caps.gqa_ratios]


def _valid(kind: str, tokens: int) -> bool:
    # A one-token query is a decode row, so prefill kinds need at least two.
    return tokens >= 1 and (kind == "decode" or kind == "mixed" or tokens >= 2)


def base_config(caps: BackendCapabilities) -> tuple[int, int] | None:
    """The (head size, GQA ratio) the main sweep uses; None if nothing the suite knows is declared."""
    heads, gqas = declared_head_sizes(caps), declared_gqa(caps)
    if not heads or not gqas:
        return None
    head = 128 if 128 in heads else heads[0]
    gqa = 4 if 4 in gqas else gqas[0]
    return head, gqa


def attention_cases(caps: BackendCapabilities, grid: str) -> list[Case]:
    """The attention comparisons for ``grid`` ("quick" or "full"), deduplicated, in a stable order."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r} (known: {', '.join(GRIDS)})")
    base = base_config(caps)
    dtypes = declared_dtypes(caps)
    if base is None or not dtypes:
        return []
    head, gqa = base
    blocks = list(caps.block_sizes)
    lengths = list(LENGTHS)
    if grid == "quick":
        # Edges at the preferred block size, a reduced set at the smallest and largest ones.
        blocks = sorted({blocks[0], min(blocks), max(blocks)}, key=blocks.index)
        dtypes = dtypes[:2]
    seen: dict[str, Case] = {}

    def add(case: Case) -> None:
        if _valid(case.kind, case.tokens) and case.id not in seen:
            seen[case.id] = case

    for dtype in dtypes:
        for block in blocks:
            lens = lengths if grid == "full" or block == caps.block_sizes[0] else ["1", "block+1", "long"]
            for kind in KINDS:
                for length in lens:
                    add(Case(dtype, head, block, gqa, kind, length))
    sweep_dtypes = dtypes if grid == "full" else dtypes[:1]
    for dtype in sweep_dtypes:
        for h in declared_head_sizes(caps):
            for g in declared_gqa(caps):
                add(Case(dtype, h, caps.block_sizes[0], g, "mixed", "block+1"))
    return list(seen.values())


def feature_cases(caps: BackendCapabilities, grid: str) -> list[Case]:
    """Batches for sliding window and soft cap: each batch kind at the preferred block size."""
    base = base_config(caps)
    dtypes = declared_dtypes(caps)
    if base is None or not dtypes:
        return []
    head, gqa = base
    kinds = KINDS if grid == "full" else ("decode", "mixed")
    return [Case(dtypes[0], head, caps.block_sizes[0], gqa, kind, "long") for kind in kinds]


def graph_capture_sizes(grid: str) -> tuple[int, ...]:
    """Token counts the graph test captures."""
    return (1, 2, 4) if grid == "quick" else (1, 2, 4, 8)


def graph_batch_sizes(grid: str) -> tuple[int, ...]:
    """Decode rows per replayed batch: every captured size plus some that must be padded up to one."""
    return (1, 2, 3, 4) if grid == "quick" else (1, 2, 3, 4, 5, 8)


def iter_universe() -> Iterator[tuple[str, str]]:
    """Every (axis, value) capability row the report lists, declared or not."""
    for d in DTYPES:
        yield "dtype", dtype_name(d)
    for h in HEAD_SIZES:
        yield "head_size", str(h)
    for g in GQA_RATIOS:
        yield "gqa", str(g)
    for k in KINDS:
        yield "batch", k
