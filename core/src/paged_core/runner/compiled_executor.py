"""``graph_mode='compiled'``: ``torch.compile`` of the whole step (or its pieces), and the backend's captures.

The whole step is compiled once with dynamic token and row dimensions (see
:mod:`paged_core.runner.executors`); with ``piecewise`` (the default for a
backend whose attention cannot be traced) its pieces between attention calls
are, instead (:mod:`paged_core.runner.compiled_pieces`). A backend whose ``graph_strategy()`` is a
:class:`~paged_core.graph.CompiledStrategy` also gets the batches its declared
graph support admits: those go through its strategy (static shapes per
capture size, padded by the core), the rest through the dynamic step, which is
also where a size whose strategy raised falls back (counted under the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from tqdm.auto import tqdm

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.metadata import AttentionMetadata
from paged_core.graph import CompiledStrategy, GraphRunner
from paged_core.runner.batch import StepBatch
from paged_core.runner.compiled_pieces import CompiledPieces, without_duck_sizing
from paged_core.runner.forward import ModelForward
from paged_core.runner.model_graphs import capture_with_progress, model_graphs, replay_sampled
from paged_core.runner.step_executor import StepExecutor
from paged_core.runner.warmup_batch import WARM_UP_SHAPES, warm_up_batch

_INTS = (
    "block_size",
    "num_decodes",
    "num_decode_tokens",
    "num_prefills",
    "num_actual_tokens",
    "max_query_len",
    "max_seq_len",
    "uniform_query_len",
)


class CompiledExecutor(StepExecutor):
    """``torch.compile`` of the step with dynamic shapes; the host ints of the metadata are arguments too."""

    mode = "compiled"

    def __init__(
        self,
        forward: ModelForward,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        block_size: int,
        compile_cache: Any = None,
        *,
        max_num_reqs: int = 2,
        max_blocks_per_seq: int = 1,
        strategy: CompiledStrategy | None = None,
        max_model_len: int | None = None,
        capture_sizes: tuple[int, ...] | None = None,
        piecewise: bool = False,
    ) -> None:
        super().__init__(forward, backend, kv_caches)
        self.graphs: GraphRunner | None = None
        if strategy is not None:
            self.graphs = model_graphs(
                forward,
                backend,
                kv_caches,
                strategy,
                block_size=block_size,
                max_blocks_per_seq=max_blocks_per_seq,
                max_num_reqs=max_num_reqs,
                max_model_len=max_model_len if max_model_len is not None else block_size * max_blocks_per_seq,
                sizes=capture_sizes,
            )
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_seq = max_blocks_per_seq
        with torch.inference_mode(False):  # like the runner's buffers (dynamo guards on dispatch keys)
            self._sampled = torch.zeros(max(max_num_reqs, 2), dtype=torch.int64, device=backend.device)
        self.compile_cache = compile_cache
        self.pieces = CompiledPieces(forward, backend, kv_caches) if piecewise else None  # type: ignore[arg-type]
        # Piecewise: the pieces are the compiled step; else the whole step (shared by engines on these weights).
        self._compiled: Callable[..., torch.Tensor] | None = None if self.pieces is not None else _whole_step(forward)

    def warm_up(self) -> None:
        start = time.perf_counter()
        if self.compile_cache is not None:
            self.compile_cache.activate()
        # With dynamic dimensions these few compiles serve every step (see warmup_batch.WARM_UP_SHAPES).
        for lens in tqdm(
            WARM_UP_SHAPES, desc="compiling the step (torch.compile)", unit="shape", disable=None, leave=False
        ):
            self._call(
                warm_up_batch(lens, self.block_size, self.backend.device, self.max_num_reqs, self.max_blocks_per_seq)
            )
        if self.graphs is not None:
            capture_with_progress(self.graphs, f"the backend's compiled steps ({self.graphs.strategy.name})")
        if self.compile_cache is not None:
            self.compile_cache.seal()
        self.stats.warmup_seconds = time.perf_counter() - start

    def run(self, batch: StepBatch) -> torch.Tensor:
        self.stats.steps += 1
        self.stats.replays += 1
        if self.graphs is not None:
            done = replay_sampled(self.graphs, batch)
            if done.output is not None:
                return done.output
            if done.failed:  # a batch the strategy should have taken: count why the dynamic step ran it
                self.stats.fallback_reasons[done.reason] += 1
        if self.pieces is not None:
            self.stats.piece_replays += 1
        return self._call(batch)

    def _call(self, batch: StepBatch) -> torch.Tensor:
        if self.pieces is not None:
            return self.pieces.run(batch)
        md = batch.metadata
        self.backend.prepare(md)
        # Dynamo specialises a dimension of size 0 or 1, and a multi-token step can sample no row (a prompt
        # chunk) or one (a prefill alone, or beside chunks): such steps pad the sampled rows to two (token 0's
        # logits, dropped below) so they reuse the warmed-up graphs. A one-token step always pads to one.
        k = batch.logits_indices.shape[0]
        n = 1 if batch.input_ids.shape[0] == 1 else max(k, 2)
        sampled = batch.logits_indices
        if n != k:
            sampled = self._sampled[:n]
            sampled[:k].copy_(batch.logits_indices)
            sampled[k:].zero_()
        assert self._compiled is not None
        logits = self._compiled(
            self.kv_caches,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            md.slot_mapping,
            batch.input_ids,
            batch.positions,
            sampled,
            *(getattr(md, name) for name in _INTS),
        )
        return logits[:k]


def _whole_step(forward: ModelForward) -> Callable[..., torch.Tensor]:
    """The whole step under ``torch.compile`` with dynamic shapes (metadata ints as arguments), shared per decoder."""
    shared = getattr(forward, "shared", None)
    compiled: Callable[..., torch.Tensor] | None = shared.get("compiled") if shared is not None else None
    if compiled is not None:
        return compiled
    fwd = forward.forward

    def step(
        caches: list[torch.Tensor],
        qsl: torch.Tensor,
        seq_lens: torch.Tensor,
        table: torch.Tensor,
        slots: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_indices: torch.Tensor,
        *ints: int,
    ) -> torch.Tensor:
        named: dict[str, Any] = dict(zip(_INTS, ints, strict=True))
        md = AttentionMetadata(qsl, seq_lens, table, slots, **named)
        return fwd(md, input_ids, positions, caches, logits_indices)

    # The caches are an argument (not captured), so engines on the same weights share one compile.
    compiled = without_duck_sizing(torch.compile(step, dynamic=True, fullgraph=False))
    if shared is not None:
        shared["compiled"] = compiled
    return compiled
