"""The eager step executor and the counters every executor keeps."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.runner.batch import StepBatch
from paged_core.runner.forward import ModelForward


@dataclass
class StepStats:
    """What the executor did, for ``/metrics`` and logs.

    ``fallback_reasons`` counts the steps a graph mode did not replay, by
    reason: batches the backend's declared graph support does not admit, and
    sizes whose capture strategy raised (``graph strategy capture raised ...``).
    """

    steps: int = 0
    replays: int = 0
    piece_replays: int = 0
    """Of ``replays``, the steps run as pieces (piecewise capture or compilation)."""
    eager_steps: int = 0
    fallback_reasons: Counter[str] = field(default_factory=Counter)
    warmup_seconds: float = 0.0


class StepExecutor:
    """Runs one prepared step; subclasses differ in how."""

    mode = "eager"

    def __init__(self, forward: ModelForward, backend: AttentionBackend, kv_caches: list[torch.Tensor]) -> None:
        self.forward = forward
        self.backend = backend
        self.kv_caches = kv_caches
        self.stats = StepStats()

    def warm_up(self) -> None:
        """Compile or capture at start (nothing to do eagerly)."""

    def run(self, batch: StepBatch) -> torch.Tensor:
        """Logits ``[K, V]`` of the batch's sampled rows."""
        self.stats.steps += 1
        self.stats.eager_steps += 1
        return self._eager(batch)

    def _eager(self, batch: StepBatch) -> torch.Tensor:
        self.backend.prepare(batch.metadata)
        if batch.layer_metadata:
            return self.forward.forward(
                batch.metadata,
                batch.input_ids,
                batch.positions,
                self.kv_caches,
                batch.logits_indices,
                layer_metadata=batch.layer_metadata,
            )
        return self.forward.forward(
            batch.metadata, batch.input_ids, batch.positions, self.kv_caches, batch.logits_indices
        )
