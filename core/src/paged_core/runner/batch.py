"""Turning one scheduler step into the backend's batch contract (token ids, positions, metadata)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from paged_core.contract.metadata import AttentionMetadata
from paged_core.contract.metadata_builder import MetadataBuilder


@dataclass(slots=True)
class RowState:
    """What the runner keeps per request between steps: known token ids, block tables, computed count.

    ``block_ids[g]`` is the table of KV-cache group ``g``; a row with one table uses it for every group
    (warm-up and profiling rows).
    """

    token_ids: list[int]
    block_ids: list[list[int]]
    num_computed: int
    lora_id: int | None = None


@dataclass
class StepBatch:
    """The flattened inputs of one forward and which requests get logits (``sample_req_ids``, in row order).

    ``sample_counts[i]`` is how many consecutive logits rows request ``sample_req_ids[i]`` gets: 1,
    or ``1 + s`` for a row verifying ``s`` speculative drafts (the logits after its last known token
    and after each draft). Every tensor is a view of the :class:`BatchBuilder`'s persistent buffers,
    valid until the next step is built.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: torch.Tensor
    sample_req_ids: list[str] = field(default_factory=list)
    sample_counts: list[int] = field(default_factory=list)
    lora_slots: torch.Tensor | None = None
    """Each token's LoRA slot (``-1``: the base model), or ``None`` when no token of the step has an adapter."""
    layer_metadata: tuple[AttentionMetadata, ...] = ()
    """With several KV-cache groups, each layer's metadata (its group's; ``metadata`` is group 0's); else empty."""


class BatchBuilder:
    """Lays out scheduled rows as the contract wants (decodes first) into buffers sized once at start.

    ``max_num_tokens`` and ``max_num_reqs`` are the scheduler's step budgets
    (``max_num_batched_tokens``, ``max_num_seqs``); ``max_blocks_per_seq``
    covers ``max_model_len``.
    """

    def __init__(
        self,
        max_num_tokens: int,
        max_num_reqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
        layer_groups: Sequence[int] = (),
    ) -> None:
        self.metadata = MetadataBuilder(max_num_reqs, max_num_tokens, max_blocks_per_seq, block_size, device)
        # Further KV-cache groups (``layer_groups[i]``: layer i's): their own tables and slots over the same rows.
        self._layer_groups = tuple(layer_groups)
        self._more = [
            MetadataBuilder(max_num_reqs, max_num_tokens, max_blocks_per_seq, block_size, device)
            for _ in range(max(layer_groups, default=0))
        ]
        self.device = device
        self._ids = torch.zeros(max_num_tokens, dtype=torch.int64)
        # Verify rows sample several tokens each: any token of the step may need logits.
        self._logits = torch.zeros(max_num_tokens, dtype=torch.int64)
        on_host = device.type == "cpu"
        self._ids_dev = self._ids if on_host else torch.zeros_like(self._ids, device=device)
        self._logits_dev = self._logits if on_host else torch.zeros_like(self._logits, device=device)
        self._lora = torch.full((max_num_tokens,), -1, dtype=torch.int64)
        self._lora_dev = self._lora if on_host else torch.zeros_like(self._lora, device=device)

    def build(
        self,
        scheduled: list[tuple[str, RowState, int]],
        drafts: Mapping[str, Sequence[int]] | None = None,
        lora_slots: Mapping[int, int] | None = None,
    ) -> StepBatch:
        """The batch for ``(request id, row, tokens this step)`` rows.

        A row gets logits only when this step reaches the end of its known
        tokens (chunked prefills in progress produce nothing to sample). A row
        scheduled past its known tokens runs ``drafts[request id]`` after them
        (speculative verification) and gets logits for each of those positions too.
        ``lora_slots`` maps a row's adapter id to its device slot (rows without one run the base model).
        """
        rows = [r for r in scheduled if r[2] == 1] + [r for r in scheduled if r[2] != 1]
        query_lens = [n for _, _, n in rows]
        seq_lens = [row.num_computed + n for _, row, n in rows]
        metadata = self.metadata.build(query_lens, seq_lens, [row.block_ids[0] for _, row, _ in rows], validate=False)
        per_layer: tuple[AttentionMetadata, ...] = ()
        if self._more:
            groups = [metadata]
            for g, builder in enumerate(self._more, start=1):
                tables = [row.block_ids[g if g < len(row.block_ids) else 0] for _, row, _ in rows]
                groups.append(builder.build(query_lens, seq_lens, tables, validate=False))
            per_layer = tuple(groups[g] for g in self._layer_groups)
        ids: list[int] = []
        sample_rows: list[int] = []
        sample_ids: list[str] = []
        counts: list[int] = []
        for (rid, row, _), end in zip(rows, seq_lens, strict=True):
            known = len(row.token_ids)
            ids += row.token_ids[row.num_computed : end]
            if end >= known:
                spec = end - known
                if spec:
                    ids += (drafts or {})[rid][:spec]
                sample_rows.extend(range(len(ids) - spec - 1, len(ids)))
                sample_ids.append(rid)
                counts.append(spec + 1)
        tokens = len(ids)
        token_loras = self._token_loras(rows, query_lens, lora_slots) if lora_slots else None
        self._ids[:tokens] = torch.tensor(ids, dtype=torch.int64)
        k = len(sample_rows)
        self._logits[:k] = torch.tensor(sample_rows, dtype=torch.int64)
        if self._ids_dev is not self._ids:
            self._ids_dev[:tokens].copy_(self._ids[:tokens], non_blocking=True)
            self._logits_dev[:k].copy_(self._logits[:k], non_blocking=True)
        return StepBatch(
            input_ids=self._ids_dev[:tokens],
            positions=self.metadata.positions,
            metadata=metadata,
            logits_indices=self._logits_dev[:k],
            sample_req_ids=sample_ids,
            sample_counts=counts,
            lora_slots=token_loras,
            layer_metadata=per_layer,
        )

    def _token_loras(
        self, rows: list[tuple[str, RowState, int]], query_lens: list[int], lora_slots: Mapping[int, int]
    ) -> torch.Tensor | None:
        """Each token's adapter slot, in the batch's row order (drafts run on their row's adapter)."""
        slots = [lora_slots[row.lora_id] if row.lora_id is not None else -1 for _, row, _ in rows]
        if all(s < 0 for s in slots):
            return None
        tokens = sum(query_lens)
        self._lora[:tokens] = torch.repeat_interleave(torch.tensor(slots), torch.tensor(query_lens))
        if self._lora_dev is self._lora:
            return self._lora[:tokens]
        self._lora_dev[:tokens].copy_(self._lora[:tokens], non_blocking=True)
        return self._lora_dev[:tokens]
