"""A step's logits rows split among their consumers: each side keeps its requests' rows, in step order."""

import torch

from paged_core.engine_core.rows import Rows


def _rows() -> Rows:
    # a: one row, b: three (two drafts), c: one; row r holds the value r in every column.
    return Rows(["a", "b", "c"], [1, 3, 1], torch.arange(5.0)[:, None].expand(5, 4).clone())


def test_split_keeps_each_requests_rows_in_order() -> None:
    drafts, plain = _rows().split(lambda rid, count: count > 1)
    assert drafts.req_ids == ["b"] and drafts.counts == [3]
    assert drafts.logits is not None and drafts.logits[:, 0].tolist() == [1.0, 2.0, 3.0]
    assert plain.req_ids == ["a", "c"] and plain.counts == [1, 1]
    assert plain.logits is not None and plain.logits[:, 0].tolist() == [0.0, 4.0]


def test_a_side_with_every_row_is_the_rows_themselves() -> None:
    rows = _rows()
    everything, nothing = rows.split(lambda rid, count: True)
    assert everything is rows and not nothing and nothing.req_ids == []
    nothing, everything = rows.split(lambda rid, count: False)
    assert everything is rows and not nothing


def test_no_rows_split_into_no_rows() -> None:
    for empty in (Rows.none(), Rows([], [], torch.empty(0, 4))):
        mine, rest = empty.split(lambda rid, count: True)
        assert not mine and not rest
