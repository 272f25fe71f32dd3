"""``graph_mode='device'``: the backend's capture strategy for the batches its graph support admits."""

from __future__ import annotations

import logging
import time

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.graph_strategy import GraphCaptureStrategy
from paged_core.runner.batch import StepBatch
from paged_core.runner.forward import ModelForward
from paged_core.runner.model_graphs import capture_with_progress, model_graphs, replay_sampled
from paged_core.runner.step_executor import StepExecutor

log = logging.getLogger("paged.engine")


class DeviceGraphExecutor(StepExecutor):
    """Replays the backend strategy's captures (device graphs for in-tree GPU backends); everything else eager.

    Which batches are replayed is the backend's declared ``graph_support``
    (uniform decode, or any batch up to the largest capture size); every
    other step, and every size whose strategy raised, runs eagerly and is
    counted under its reason.
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
    ) -> None:
        super().__init__(forward, backend, kv_caches)
        self.graphs = model_graphs(
            forward,
            backend,
            kv_caches,
            strategy,
            block_size=block_size,
            max_blocks_per_seq=max_blocks_per_seq,
            max_num_reqs=max_num_reqs,
            max_model_len=max_model_len,
            sizes=sizes,
        )

    def warm_up(self) -> None:
        start = time.perf_counter()
        capture_with_progress(self.graphs, f"graphs ({self.graphs.strategy.name})")
        self.stats.warmup_seconds = time.perf_counter() - start
        log.info(
            "captured %d graphs with strategy %r (sizes %s; failed %s) in %.1f s",
            len(self.graphs.sizes) - len(self.graphs.failures),
            self.graphs.strategy.name,
            self.graphs.sizes,
            sorted(self.graphs.failures) or "none",
            self.stats.warmup_seconds,
        )

    def run(self, batch: StepBatch) -> torch.Tensor:
        self.stats.steps += 1
        done = replay_sampled(self.graphs, batch)
        if done.output is not None:
            self.stats.replays += 1
            return done.output
        self.stats.eager_steps += 1
        self.stats.fallback_reasons[done.reason] += 1
        return self._eager(batch)
