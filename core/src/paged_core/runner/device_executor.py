"""``graph_mode='device'``: the backend's capture strategy for the batches its graph support admits."""

from __future__ import annotations

import logging
import time

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import GraphSupport
from paged_core.contract.graph_strategy import GraphCaptureStrategy
from paged_core.graph import capture_sizes
from paged_core.runner.batch import StepBatch
from paged_core.runner.forward import ModelForward
from paged_core.runner.model_graphs import capture_with_progress, model_graphs, replay_sampled
from paged_core.runner.piece_graphs import PieceGraphs
from paged_core.runner.step_executor import StepExecutor

log = logging.getLogger("paged.engine")

PIECE_DEFAULT_MAX_SIZE = 512
"""Largest default piece size: mixed steps carry prompt chunks, so they are larger than decode batches (bounded
by the step's token budget)."""


class DeviceGraphExecutor(StepExecutor):
    """Replays the backend strategy's captures (device graphs for in-tree GPU backends); everything else eager.

    Which batches are replayed is the backend's declared ``graph_support``
    (uniform decode, or any batch up to the largest capture size); every
    other step, and every size whose strategy raised, runs eagerly and is
    counted under its reason. With ``piecewise``, whole-step graphs take
    uniform decode batches only and every other step up to the largest piece
    size replays the decoder's pieces (:class:`~paged_core.runner.piece_graphs.PieceGraphs`),
    captured by the same strategy; only what neither takes runs eagerly.
    """

    mode = "device"

    def __init__(
        self,
        forward: ModelForward,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        strategy: GraphCaptureStrategy,
        *,
        block_size: int,
        max_blocks_per_seq: int,
        max_num_reqs: int,
        max_model_len: int,
        sizes: tuple[int, ...] | None,
        piecewise: bool = False,
        max_num_tokens: int = 0,
    ) -> None:
        super().__init__(forward, backend, kv_caches)
        whole = sizes
        if piecewise and sizes:  # one list for both: whole-step graphs hold decode batches, at most a row budget
            whole = tuple(s for s in sizes if s <= max_num_reqs) or None
        self.graphs = model_graphs(
            forward,
            backend,
            kv_caches,
            strategy,
            block_size=block_size,
            max_blocks_per_seq=max_blocks_per_seq,
            max_num_reqs=max_num_reqs,
            max_model_len=max_model_len,
            sizes=whole,
            support=GraphSupport.UNIFORM_DECODE if piecewise else None,
        )
        self.pieces: PieceGraphs | None = None
        if piecewise:
            largest = max(1, min(max_num_tokens, PIECE_DEFAULT_MAX_SIZE))
            piece_sizes = list(sizes) if sizes else capture_sizes(largest)
            self.pieces = PieceGraphs(forward, backend, kv_caches, strategy, piece_sizes)  # type: ignore[arg-type]

    def warm_up(self) -> None:
        start = time.perf_counter()
        capture_with_progress(self.graphs, f"graphs ({self.graphs.strategy.name})")
        if self.pieces is not None:
            capture_with_progress(self.pieces, f"pieces ({self.graphs.strategy.name})")
        self.stats.warmup_seconds = time.perf_counter() - start
        log.info(
            "captured %d graphs with strategy %r (sizes %s; failed %s), pieces for sizes %s in %.1f s",
            len(self.graphs.sizes) - len(self.graphs.failures),
            self.graphs.strategy.name,
            self.graphs.sizes,
            sorted(self.graphs.failures) or "none",
            self.pieces.sizes if self.pieces is not None else "none",
            self.stats.warmup_seconds,
        )

    def run(self, batch: StepBatch) -> torch.Tensor:
        self.stats.steps += 1
        done = replay_sampled(self.graphs, batch)
        if done.output is not None:
            self.stats.replays += 1
            return done.output
        counted = False
        if self.pieces is not None:
            if done.failed:  # the whole-step graph of this size raised: counted even when the pieces take the step
                self.stats.fallback_reasons[done.reason] += 1
                counted = True
            piece = self.pieces.replay(batch)
            if piece.output is not None:
                self.stats.replays += 1
                self.stats.piece_replays += 1
                return piece.output
            if not counted:
                done = piece
        self.stats.eager_steps += 1
        if not counted:
            self.stats.fallback_reasons[done.reason] += 1
        return self._eager(batch)
