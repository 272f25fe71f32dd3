"""build_step_batch: the scheduler's rows laid out as the backend contract wants."""

from __future__ import annotations

import torch

from paged_core.engine.batch import RowState, build_step_batch


def test_decodes_first_slots_and_logits_rows() -> None:
    bs = 4
    prefill = RowState(token_ids=list(range(10)), block_ids=[7, 3, 9], num_computed=4)  # chunk 4..9 (6 tokens)
    decode = RowState(token_ids=[5, 6, 7, 8, 9], block_ids=[2, 5], num_computed=4)  # last token at position 4
    middle = RowState(token_ids=list(range(12)), block_ids=[1, 4, 6], num_computed=0)  # chunk 0..4 of 12
    batch = build_step_batch([("p", prefill, 6), ("d", decode, 1), ("m", middle, 5)], bs, torch.device("cpu"))
    md = batch.metadata
    assert md.num_decodes == 1 and md.num_prefills == 2
    assert md.query_start_loc.tolist() == [0, 1, 7, 12]
    assert md.seq_lens.tolist() == [5, 10, 5]
    assert batch.input_ids.tolist() == [9, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    assert batch.positions.tolist() == [4, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    # position 4 of row d sits in its block 1 (id 5), offset 0
    assert md.slot_mapping[0].item() == 5 * bs + 0
    assert md.slot_mapping[1:7].tolist() == [3 * 4 + 0, 3 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1]
    assert md.block_table.tolist() == [[2, 5, 0], [7, 3, 9], [1, 4, 6]]
    # d and p reach their last known token; m is mid-prefill and gets no logits.
    assert batch.sample_req_ids == ["d", "p"]
    assert batch.logits_indices.tolist() == [0, 6]
    assert md.max_query_len == 6 and md.max_seq_len == 10 and md.num_actual_tokens == 12
