"""Turning one scheduler step into the backend's batch contract (token ids, positions, metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paged_core.contract.metadata import AttentionMetadata


@dataclass(slots=True)
class RowState:
    """What the runner keeps per request between steps: known token ids, block table, computed count."""

    token_ids: list[int]
    block_ids: list[int]
    num_computed: int


@dataclass
class StepBatch:
    """The flattened inputs of one forward and which requests get logits (``sample_req_ids``, in row order)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: torch.Tensor
    sample_req_ids: list[str] = field(default_factory=list)


def build_step_batch(
    scheduled: list[tuple[str, RowState, int]], block_size: int, device: torch.device
) -> StepBatch:
    """Lay out ``(request id, row, tokens this step)`` rows as the contract wants: decodes first.

    A row gets logits only when this step reaches the end of its known tokens
    (chunked prefills in progress produce nothing to sample).
    """
    rows = [r for r in scheduled if r[2] == 1] + [r for r in scheduled if r[2] != 1]
    num_decodes = sum(1 for r in rows if r[2] == 1)
    ids: list[int] = []
    positions: list[int] = []
    row_of_token: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    sample_rows: list[int] = []
    sample_ids: list[str] = []
    for b, (rid, row, n) in enumerate(rows):
        start, end = row.num_computed, row.num_computed + n
        if n == 1:
            ids.append(row.token_ids[start])
            positions.append(start)
            row_of_token.append(b)
        else:
            ids.extend(row.token_ids[start:end])
            positions.extend(range(start, end))
            row_of_token.extend([b] * n)
        qsl.append(qsl[-1] + n)
        seq_lens.append(end)
        tables.append(row.block_ids)
        if end >= len(row.token_ids):
            sample_rows.append(qsl[-1] - 1)
            sample_ids.append(rid)
    width = max((len(t) for t in tables), default=1) or 1
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    pos = torch.tensor(positions, dtype=torch.int64)
    row_idx = torch.tensor(row_of_token, dtype=torch.int64)
    slots = table[row_idx, pos // block_size].to(torch.int64) * block_size + pos % block_size
    query_lens = [r[2] for r in rows]
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=table.to(device),
        slot_mapping=slots.to(device),
        block_size=block_size,
        num_decodes=num_decodes,
        num_decode_tokens=num_decodes,
        num_prefills=len(rows) - num_decodes,
        num_actual_tokens=qsl[-1],
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )
    return StepBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=pos.to(device),
        metadata=metadata,
        logits_indices=torch.tensor(sample_rows, dtype=torch.int64, device=device),
        sample_req_ids=sample_ids,
    )
