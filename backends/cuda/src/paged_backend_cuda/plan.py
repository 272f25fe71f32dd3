"""The launch plan of one attention call, from host ints only (so it is the same at capture and replay).

Decode rows (query length 1, first in the batch) get a launch of their own whose long contexts split into
key ranges (flash-decoding) when the batch alone would not fill the GPU; prefill rows get one launch with
eight-row tiles. Graphs freeze ``max_seq_len`` at the model's bound, so the split plan covers every replay
(ranges past a row's length contribute nothing to the reduction).
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_BLOCKS_PER_SM = 4
"""Thread blocks per SM the split plan aims for (128 threads each, 80-250 registers)."""
MIN_SPLIT_KEYS = 256
"""A split below this many keys costs more in the reduction than it gains in parallelism."""
MAX_SPLITS = 64
SPLIT_ALIGN = 64


@dataclass(frozen=True)
class Launch:
    """One kernel launch over batch rows ``[first_row, first_row + num_rows)``."""

    first_row: int
    num_rows: int
    max_query_len: int
    rows_per_tile: int
    num_splits: int = 1
    split_keys: int = 0


def rows_per_tile(group: int, max_query_len: int) -> int:
    """Query rows per thread block: a decode row's GQA group (1, 4 or 8 heads), else eight."""
    if max_query_len > 1:
        return 8
    return 1 if group == 1 else 4 if group <= 4 else 8


def decode_splits(num_rows: int, num_kv_heads: int, group: int, max_seq_len: int, sm_count: int) -> tuple[int, int]:
    """``(num_splits, split_keys)`` for decode rows: split until the grid fills ``sm_count`` SMs."""
    tile = rows_per_tile(group, 1)
    blocks = num_rows * num_kv_heads * -(-group // tile)
    wanted = -(-(TARGET_BLOCKS_PER_SM * sm_count) // max(blocks, 1))
    splits = max(1, min(wanted, max_seq_len // MIN_SPLIT_KEYS, MAX_SPLITS))
    if splits == 1:
        return 1, 0
    keys = -(-max_seq_len // splits)
    keys = -(-keys // SPLIT_ALIGN) * SPLIT_ALIGN
    return -(-max_seq_len // keys), keys


def launches(
    num_decodes: int,
    num_prefills: int,
    max_query_len: int,
    max_seq_len: int,
    num_kv_heads: int,
    group: int,
    sm_count: int,
) -> list[Launch]:
    """The launches for a batch as the metadata's host ints describe it."""
    plan = []
    if num_decodes:
        splits, keys = decode_splits(num_decodes, num_kv_heads, group, max_seq_len, sm_count)
        plan.append(Launch(0, num_decodes, 1, rows_per_tile(group, 1), splits, keys))
    if num_prefills:
        plan.append(Launch(num_decodes, num_prefills, max_query_len, rows_per_tile(group, max_query_len)))
    return plan
