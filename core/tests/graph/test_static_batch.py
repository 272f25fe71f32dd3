"""Copying a batch into the static buffers, and the padding rules."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import ConfigError, build_attention_metadata
from paged_core.graph import StaticBatch, StaticInput

QUERY = StaticInput("query", (2, 3))


def make_buffers(max_tokens: int = 8) -> StaticBatch:
    return StaticBatch(max_tokens, max_blocks_per_seq=4, inputs=[QUERY], device=torch.device("cpu"))


def test_decode_batch_is_padded_with_one_token_rows() -> None:
    buf = make_buffers()
    md = build_attention_metadata([1, 1, 1], [5, 2, 9], [[3, 7], [4], [9, 2, 6]], block_size=4)
    query = torch.randn(3, 2, 3)
    buf.fill(4, md, {"query": query})
    qsl, seq, table, slots, q = buf.args(4)
    assert qsl.tolist() == [0, 1, 2, 3, 4]
    assert seq.tolist() == [5, 2, 9, 1]
    assert table.tolist() == [[3, 7, 0, 0], [4, 0, 0, 0], [9, 2, 6, 0], [0, 0, 0, 0]]
    assert slots.tolist() == [7 * 4 + 0, 4 * 4 + 1, 6 * 4 + 0, -1]
    assert torch.equal(q[:3], query) and torch.equal(q[3], torch.zeros(2, 3))


def test_stale_values_from_a_larger_batch_are_cleared() -> None:
    buf = make_buffers()
    big = build_attention_metadata([1] * 8, [4] * 8, [[i + 1, 9, 9, 9] for i in range(8)], block_size=4)
    buf.fill(8, big, {"query": torch.ones(8, 2, 3)})
    small = build_attention_metadata([1], [3], [[5]], block_size=4)
    buf.fill(2, small, {"query": torch.ones(1, 2, 3)})
    qsl, seq, table, slots, q = buf.args(2)
    assert qsl.tolist() == [0, 1, 2] and seq.tolist() == [3, 1]
    assert table.tolist() == [[5, 0, 0, 0], [0, 0, 0, 0]]  # the old row 0's trailing 9s are gone
    assert slots.tolist() == [5 * 4 + 2, -1]
    assert torch.equal(q[1], torch.zeros(2, 3))


def test_mixed_batch_pads_tokens_then_empty_rows() -> None:
    buf = make_buffers()
    # 2 rows, 5 tokens, padded to 8 tokens and 8 rows: 3 one-token padding rows, then 3 empty rows.
    md = build_attention_metadata([1, 4], [6, 4], [[1, 2], [3]], block_size=4)
    buf.fill(8, md, {"query": torch.randn(5, 2, 3)})
    qsl, seq, _, slots, _ = buf.args(8)
    assert qsl.tolist() == [0, 1, 5, 6, 7, 8, 8, 8, 8]
    assert seq.tolist() == [6, 4, 1, 1, 1, 0, 0, 0]
    assert slots[5:].tolist() == [-1, -1, -1]


def test_all_padding_batch() -> None:
    buf = make_buffers()
    buf.fill_padding(4)
    qsl, seq, table, slots, q = buf.args(4)
    assert qsl.tolist() == [0, 1, 2, 3, 4] and seq.tolist() == [1, 1, 1, 1]
    assert int(table.abs().sum()) == 0 and slots.tolist() == [-1] * 4 and int(q.abs().sum()) == 0


def test_input_errors_name_the_problem() -> None:
    buf = make_buffers()
    md = build_attention_metadata([1], [1], [[1]], block_size=4)
    with pytest.raises(ConfigError, match="do not match"):
        buf.fill(1, md, {"ids": torch.zeros(1)})
    with pytest.raises(ConfigError, match="'query' has shape"):
        buf.fill(1, md, {"query": torch.zeros(1, 3, 2)})
    with pytest.raises(ConfigError, match="unique"):
        StaticBatch(4, 2, [QUERY, QUERY], torch.device("cpu"))
    with pytest.raises(ConfigError, match="identifier"):
        StaticInput("input ids")
