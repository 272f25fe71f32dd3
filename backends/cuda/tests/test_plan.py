"""The launch plan: tiles per GQA group, decode splits from host ints only."""

from __future__ import annotations

import pytest

from paged_backend_cuda import plan


@pytest.mark.parametrize(("group", "tile"), [(1, 1), (2, 4), (4, 4), (5, 8), (8, 8), (16, 8)])
def test_decode_tiles_hold_the_group(group: int, tile: int) -> None:
    assert plan.rows_per_tile(group, 1) == tile


def test_prefill_tiles_are_eight_rows() -> None:
    assert plan.rows_per_tile(1, 7) == 8 and plan.rows_per_tile(8, 300) == 8


def test_one_long_decode_row_splits_to_fill_the_gpu() -> None:
    splits, keys = plan.decode_splits(1, 8, 4, 8192, 132)
    assert 1 < splits <= plan.MAX_SPLITS
    assert keys % plan.SPLIT_ALIGN == 0 and keys >= plan.MIN_SPLIT_KEYS
    assert splits * keys >= 8192 > (splits - 1) * keys  # every key in exactly one split, no empty last split


def test_a_full_batch_or_a_short_context_does_not_split() -> None:
    assert plan.decode_splits(256, 8, 4, 8192, 132) == (1, 0)
    assert plan.decode_splits(1, 8, 4, 300, 132) == (1, 0)


def test_launches_cover_decode_then_prefill_rows() -> None:
    steps = plan.launches(
        num_decodes=3, num_prefills=2, max_query_len=50, max_seq_len=4096, num_kv_heads=2, group=4, sm_count=132
    )
    assert [(s.first_row, s.num_rows, s.max_query_len) for s in steps] == [(0, 3, 1), (3, 2, 50)]
    assert steps[0].num_splits > 1 and steps[1].num_splits == 1


def test_graph_padded_any_batch_is_one_general_launch() -> None:
    """An ANY graph's conservative ints (every row a prefill row) give one launch over all rows."""
    steps = plan.launches(0, 64, 64, 32768, 8, 4, 132)
    assert len(steps) == 1 and steps[0].num_rows == 64 and steps[0].num_splits == 1
