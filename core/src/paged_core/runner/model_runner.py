"""The model runner: keeps per-request rows in sync with the scheduler and runs one forward per step."""

from __future__ import annotations

from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.errors import PagedError
from paged_core.lora.slots import LoRASlots
from paged_core.runner.batch import BatchBuilder, RowState, StepBatch
from paged_core.runner.executors import StepExecutor, make_executor
from paged_core.runner.forward import ModelForward
from paged_core.runner.fused.decoder import LoRAStep
from paged_core.sched.output import SchedulerOutput


class ModelRunner:
    """Runs a causal LM over a paged KV cache, one scheduler step at a time.

    The runner mirrors what the scheduler told it (new rows, tokens and blocks
    gained, copy-on-write replacements, finished and preempted rows) and never
    asks the scheduler anything: it is a function of the scheduler outputs, so
    the two could live in different processes.
    ``forward`` is the model path (the fused decoder or transformers'
    modules, see :mod:`paged_core.runner.forward`); ``graph_mode`` picks how
    steps run (see :mod:`paged_core.runner.executors`).
    """

    def __init__(
        self,
        forward: ModelForward,
        backend: AttentionBackend,
        specs: list[AttentionSpec],
        kv_caches: list[torch.Tensor],
        block_size: int,
        *,
        max_num_tokens: int,
        max_num_reqs: int,
        max_model_len: int,
        graph_mode: str = "eager",
        capture_sizes: tuple[int, ...] | None = None,
        compile_cache: Any = None,
        piecewise: bool | None = None,
        lora: LoRASlots | None = None,
        layer_groups: tuple[int, ...] = (),
    ) -> None:
        self.forward_impl = forward
        self.backend = backend
        self.specs = specs
        self.kv_caches = kv_caches
        # Layers of different KV-cache groups share tensors: block copies touch each tensor once.
        self._cache_tensors = list({id(c): c for c in kv_caches}.values())
        self.block_size = block_size
        self.device = backend.device
        self.rows: dict[str, RowState] = {}
        self.num_block_copies = 0
        self.lora = lora
        """Adapter slots (``enable_lora``), or ``None``."""
        max_blocks = -(-max_model_len // block_size) + 1
        self.batches = BatchBuilder(max_num_tokens, max_num_reqs, max_blocks, block_size, self.device, layer_groups)
        self.executor: StepExecutor = make_executor(
            graph_mode,
            forward,
            backend,
            kv_caches,
            block_size=block_size,
            max_blocks_per_seq=max_blocks,
            max_num_reqs=max_num_reqs,
            max_model_len=max_model_len,
            capture_sizes=capture_sizes,
            compile_cache=compile_cache,
            piecewise=piecewise,
            max_num_tokens=max_num_tokens,
        )

    @property
    def graph_mode(self) -> str:
        """The mode steps run in (``eager``, ``compiled`` or ``device``)."""
        return self.executor.mode

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Compile or capture now (start-up), so the first real step does not pay for it."""
        self.executor.warm_up()

    def update_states(self, out: SchedulerOutput) -> None:
        """Apply one scheduler output to the rows (before the step runs)."""
        for rid in out.finished_req_ids:
            self.rows.pop(rid, None)
        for rid in out.preempted_req_ids:
            self.rows.pop(rid, None)
        for new in out.scheduled_new_reqs:
            lora_id = None
            if new.lora is not None:
                if self.lora is None:
                    raise PagedError(f"request {new.req_id!r} names LoRA adapter {new.lora.name!r}, but LoRA is off")
                lora_id = self.lora.register(new.lora).id
            tables = [list(t) for t in new.block_ids]
            self.rows[new.req_id] = RowState(list(new.token_ids), tables, new.num_computed_tokens, lora_id)
        cached = out.scheduled_cached_reqs
        for rid, blocks, computed, tokens in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, cached.new_token_ids, strict=True
        ):
            row = self.rows[rid]
            if tokens:
                row.token_ids.extend(tokens)
            if blocks:
                for table, gained in zip(row.block_ids, blocks, strict=True):
                    table.extend(gained)
            row.num_computed = computed
        for rid, replaced in out.replaced_block_ids.items():
            tables = self.rows[rid].block_ids
            for group, index, block_id in replaced:
                tables[group][index] = block_id

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate shared blocks in every layer before attention writes into them."""
        if pairs:
            src_to_dst = torch.tensor(pairs, dtype=torch.int64, device=self.device).view(-1, 2)
            self.backend.copy_blocks(self._cache_tensors, src_to_dst)
            self.num_block_copies += len(pairs)

    def prepare_batch(self, out: SchedulerOutput) -> StepBatch:
        """The step's contract tensors; advances each row's computed count."""
        scheduled = []
        for rid, n in out.num_scheduled_tokens.items():
            row = self.rows.get(rid)
            if row is None:
                raise PagedError(f"scheduler scheduled {rid!r}, which the runner does not know")
            scheduled.append((rid, row, n))
        loras = None
        if self.lora is not None:
            loras = self.lora.activate(row.lora_id for _, row, _ in scheduled if row.lora_id is not None)
        batch = self.batches.build(scheduled, out.scheduled_spec_decode_tokens, loras)
        for _, row, n in scheduled:
            row.num_computed += n
        return batch

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[str], list[int], torch.Tensor | None]:
        """Run one step: the request ids that reached their last known token, how many logits rows each
        has (1, or 1 + its drafts when verifying), and those logits ``[sum(counts), V]``."""
        self.update_states(out)
        if out.is_empty:
            return [], [], None
        self.copy_blocks(out.block_copies)
        batch = self.prepare_batch(out)
        return batch.sample_req_ids, batch.sample_counts, self.forward(batch)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """One model forward over a prepared batch; logits ``[K, V]`` of its sampled rows."""
        if hasattr(self.forward_impl, "lora"):  # the fused decoder, shared by engines: this step's adapters
            step = None
            if self.lora is not None and batch.lora_slots is not None:
                step = LoRAStep(self.lora, batch.lora_slots)
            self.forward_impl.lora = step
        return self.executor.run(batch)
