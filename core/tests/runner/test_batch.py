"""BatchBuilder: the scheduler's rows laid out as the backend contract wants, in persistent buffers."""

from __future__ import annotations

import torch

from paged_core.runner.batch import BatchBuilder, RowState


def test_decodes_first_slots_and_logits_rows() -> None:
    bs = 4
    prefill = RowState(token_ids=list(range(10)), block_ids=[[7, 3, 9]], num_computed=4)  # chunk 4..9 (6 tokens)
    decode = RowState(token_ids=[5, 6, 7, 8, 9], block_ids=[[2, 5]], num_computed=4)  # last token at position 4
    middle = RowState(token_ids=list(range(12)), block_ids=[[1, 4, 6]], num_computed=0)  # chunk 0..4 of 12
    builder = BatchBuilder(32, 8, 3, bs, torch.device("cpu"))
    batch = builder.build([("p", prefill, 6), ("d", decode, 1), ("m", middle, 5)])
    md = batch.metadata
    assert md.num_decodes == 1 and md.num_prefills == 2 and md.uniform_query_len == 0
    assert md.query_start_loc.tolist() == [0, 1, 7, 12]
    assert md.query_start_loc_cpu is not None and md.query_start_loc_cpu.tolist() == [0, 1, 7, 12]
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


def test_buffers_are_reused_and_stale_rows_cleared() -> None:
    builder = BatchBuilder(32, 8, 4, 4, torch.device("cpu"))
    wide = [(f"r{i}", RowState([1] * 9, [[i + 1, i + 2, i + 3]], 8), 1) for i in range(3)]
    first = builder.build(wide)
    assert first.metadata.uniform_query_len == 1 and first.metadata.num_decodes == 3
    narrow = builder.build([("x", RowState([1, 2], [[6]], 1), 1)])
    md = narrow.metadata
    # Same storage as the first step (no per-step allocation of the contract tensors) ...
    assert md.block_table.data_ptr() == first.metadata.block_table.data_ptr()
    # ... and nothing of the wider step survives in the rows or columns this one reads.
    assert md.block_table.tolist() == [[6, 0, 0, 0]]
    assert builder.metadata._table[1:3].abs().sum().item() == 0
    assert md.slot_mapping.tolist() == [6 * 4 + 1]


def test_speculative_shaped_rows_are_uniform_not_decodes() -> None:
    builder = BatchBuilder(32, 8, 4, 4, torch.device("cpu"))
    rows = [(f"r{i}", RowState(list(range(8)), [[1, 2]], 5), 3) for i in range(2)]
    md = builder.build(rows).metadata
    assert md.uniform_query_len == 3 and md.num_decodes == 0 and md.num_prefills == 2


def test_each_kv_cache_group_gets_its_own_tables_and_slots() -> None:
    """Layers of groups 0, 1, 0, 2: each layer's metadata is its group's (group 0's is ``metadata``), built
    from ``block_ids[g]``; entries behind a sliding window are the null block; a row with one table (warm-up)
    uses it for every group."""
    bs = 4
    builder = BatchBuilder(32, 8, 3, bs, torch.device("cpu"), layer_groups=(0, 1, 0, 2))
    hybrid = RowState(list(range(10)), [[7, 3, 9], [0, 4, 6], [0, 0, 8]], num_computed=9)  # decode position 9
    single = RowState(list(range(3)), [[5]], num_computed=0)  # prefill 0..2
    batch = builder.build([("h", hybrid, 1), ("s", single, 3)])
    md = batch.metadata
    assert len(batch.layer_metadata) == 4
    assert batch.layer_metadata[0] is md and batch.layer_metadata[2] is md
    g1, g2 = batch.layer_metadata[1], batch.layer_metadata[3]
    assert md.block_table.tolist() == [[7, 3, 9], [5, 0, 0]]
    assert g1.block_table.tolist() == [[0, 4, 6], [5, 0, 0]]
    assert g2.block_table.tolist() == [[0, 0, 8], [5, 0, 0]]
    # Position 9 sits in table entry 2 at offset 1 of each group's own block; the single-table row writes 5's.
    assert md.slot_mapping.tolist() == [9 * bs + 1, 5 * bs, 5 * bs + 1, 5 * bs + 2]
    assert g1.slot_mapping.tolist() == [6 * bs + 1, 5 * bs, 5 * bs + 1, 5 * bs + 2]
    assert g2.slot_mapping.tolist() == [8 * bs + 1, 5 * bs, 5 * bs + 1, 5 * bs + 2]
    for m in (g1, g2):
        assert m.seq_lens.tolist() == md.seq_lens.tolist() == [10, 3]
        assert m.query_start_loc.tolist() == md.query_start_loc.tolist() == [0, 1, 4]
    one_group = BatchBuilder(32, 8, 3, bs, torch.device("cpu")).build([("s", single, 3)])
    assert one_group.layer_metadata == ()
