"""The model runner: keeps per-request rows in sync with the scheduler and runs one forward per step."""

from __future__ import annotations

from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.engine.attention import ForwardContext, forward_context
from paged_core.engine.batch import RowState, StepBatch, build_step_batch
from paged_core.errors import PagedError
from paged_core.sched.output import SchedulerOutput


class ModelRunner:
    """Runs a transformers causal LM over a paged KV cache.

    The runner mirrors what the scheduler told it (new rows, blocks gained,
    copy-on-write replacements, finished and preempted rows) and never asks
    the scheduler anything, so the two could live in different processes.
    """

    def __init__(
        self,
        model: Any,
        backend: AttentionBackend,
        specs: list[AttentionSpec],
        kv_caches: list[torch.Tensor],
        block_size: int,
    ) -> None:
        self.model = model
        self.backend = backend
        self.specs = specs
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = backend.device
        self.rows: dict[str, RowState] = {}
        self.num_block_copies = 0

    def update_states(self, out: SchedulerOutput) -> None:
        """Apply one scheduler output to the rows (before the step runs)."""
        for rid in out.finished_req_ids:
            self.rows.pop(rid, None)
        for rid in out.preempted_req_ids:
            self.rows.pop(rid, None)
        for new in out.scheduled_new_reqs:
            self.rows[new.req_id] = RowState(list(new.token_ids), list(new.block_ids), new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        for rid, blocks, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            row = self.rows[rid]
            if blocks:
                row.block_ids.extend(blocks)
            row.num_computed = computed
        for rid, replaced in out.replaced_block_ids.items():
            table = self.rows[rid].block_ids
            for index, block_id in replaced:
                table[index] = block_id

    def append_tokens(self, req_id: str, token_ids: list[int]) -> None:
        """Record tokens the engine accepted for a row (they are the next step's inputs)."""
        row = self.rows.get(req_id)
        if row is not None:
            row.token_ids.extend(token_ids)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate shared blocks in every layer before attention writes into them."""
        if pairs:
            src_to_dst = torch.tensor(pairs, dtype=torch.int64, device=self.device).view(-1, 2)
            self.backend.copy_blocks(self.kv_caches, src_to_dst)
            self.num_block_copies += len(pairs)

    def prepare_batch(self, out: SchedulerOutput) -> StepBatch:
        """The step's contract tensors; advances each row's computed count."""
        scheduled = []
        for rid, n in out.num_scheduled_tokens.items():
            row = self.rows.get(rid)
            if row is None:
                raise PagedError(f"scheduler scheduled {rid!r}, which the runner does not know")
            scheduled.append((rid, row, n))
        batch = build_step_batch(scheduled, self.block_size, self.device)
        for _, row, n in scheduled:
            row.num_computed += n
        return batch

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[str], torch.Tensor | None]:
        """Run one step; returns the request ids that reached their last known token and their logits ``[K, V]``."""
        self.update_states(out)
        if out.is_empty:
            return [], None
        self.copy_blocks(out.block_copies)
        batch = self.prepare_batch(out)
        return batch.sample_req_ids, self.forward(batch)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """One model forward over a prepared batch; logits ``[K, V]`` of its sampled rows."""
        self.backend.prepare(batch.metadata)
        ctx = ForwardContext(self.backend, self.kv_caches, self.specs, batch.metadata)
        with forward_context(ctx):
            result = self.model(
                input_ids=batch.input_ids.unsqueeze(0),
                position_ids=batch.positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=batch.logits_indices,
            )
        logits: torch.Tensor = result.logits[0]
        return logits
