"""The batch contract builder."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import PagedError, build_attention_metadata


def test_builds_contract_tensors_decode_rows_first() -> None:
    md = build_attention_metadata(
        query_lens=[1, 1, 5], seq_lens=[7, 3, 9], block_tables=[[4, 2], [9], [5, 6, 8]], block_size=4
    )
    assert md.query_start_loc.tolist() == [0, 1, 2, 7] and md.query_start_loc.dtype == torch.int32
    assert md.seq_lens.tolist() == [7, 3, 9] and md.seq_lens.dtype == torch.int32
    assert md.block_table.tolist() == [[4, 2, 0], [9, 0, 0], [5, 6, 8]] and md.block_table.dtype == torch.int32
    # Row 0 writes position 6 (block 2, offset 2); row 1 position 2 of block 9; row 2 positions 4..8.
    assert md.slot_mapping.tolist() == [2 * 4 + 2, 9 * 4 + 2, 6 * 4, 6 * 4 + 1, 6 * 4 + 2, 6 * 4 + 3, 8 * 4]
    assert md.slot_mapping.dtype == torch.int64
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (2, 2, 1)
    assert (md.num_actual_tokens, md.max_query_len, md.max_seq_len) == (7, 5, 9)
    assert md.context_lens().tolist() == [6, 2, 4]


def test_fixed_width_block_table() -> None:
    md = build_attention_metadata([1], [3], [[7]], block_size=4, max_blocks_per_seq=5)
    assert md.block_table.shape == (1, 5)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (([2, 1], [4, 4], [[1], [2]], 4), "decode rows must come before"),
        (([0], [3], [[1]], 4), "0 < query_len <= seq_len"),
        (([3], [2], [[1]], 4), "0 < query_len <= seq_len"),
        (([1], [9], [[1, 2]], 4), "cannot hold"),
        (([1, 1], [1], [[1], [2]], 4), "one entry per row"),
    ],
)
def test_bad_batches_are_refused(args: tuple, needle: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(PagedError, match=needle):
        build_attention_metadata(*args)
