"""The backend's capture strategy over the model's step: a :class:`GraphRunner` and the sampled rows' logits.

Both graph executors use it: ``device`` for every batch the backend's declared
graph support admits, ``compiled`` when the backend's strategy is a
:class:`~paged_core.graph.CompiledStrategy`. The core keeps the sizes, static
buffers, warm-up, dispatch and fallback (:class:`~paged_core.graph.GraphRunner`);
the strategy only captures and replays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from tqdm.auto import tqdm

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import GraphSupport
from paged_core.contract.graph_strategy import GraphCaptureStrategy
from paged_core.contract.metadata import AttentionMetadata
from paged_core.graph import CompiledStrategy, GraphRunner, Replay, StaticInput, capture_sizes
from paged_core.runner.batch import StepBatch
from paged_core.runner.forward import ModelForward

COMPILED_DEFAULT_MAX_SIZE = 8
"""Largest default capture size for a compiling strategy: each size is a compile at start (seconds each
with inductor), so by default only small decode batches (1, 2, 4, 8 tokens) get one; larger batches take
the executor's other path. An explicit ``capture_sizes`` list is used as given."""


def model_graphs(
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
    support: GraphSupport | None = None,
) -> GraphRunner:
    """A runner whose step is the whole model forward, returning every token's logits."""
    fwd, caches = forward.forward, kv_caches
    largest = max_num_reqs
    if sizes is None and isinstance(strategy, CompiledStrategy):
        largest = min(max_num_reqs, COMPILED_DEFAULT_MAX_SIZE)

    def step(metadata: AttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return fwd(metadata, input_ids, positions, caches, None)

    return GraphRunner(
        backend,
        step,
        block_size=block_size,
        max_blocks_per_seq=max_blocks_per_seq,
        capture_sizes=capture_sizes(largest, list(sizes) if sizes else None),
        device=backend.device,
        inputs=[StaticInput("input_ids", (), torch.int64), StaticInput("positions", (), torch.int64)],
        max_model_len=max_model_len,
        strategy=strategy,
        support=support,
    )


class Capturable(Protocol):
    """What :func:`capture_with_progress` drives: whole-step graphs or pieces."""

    sizes: list[int]

    def capture_all(self, on_captured: Callable[[int], None] | None = None) -> None: ...


def capture_with_progress(graphs: Capturable, what: str) -> None:
    """Capture every size of ``graphs`` behind a progress bar naming ``what``."""
    with tqdm(total=len(graphs.sizes), desc=f"capturing {what}", unit="size", disable=None, leave=False) as bar:
        graphs.capture_all(on_captured=lambda n: bar.update(1))


def replay_sampled(graphs: GraphRunner, batch: StepBatch) -> Replay:
    """Replay ``batch`` if admitted; the output is the sampled rows' logits ``[K, V]``."""
    done = graphs.replay(batch.metadata, input_ids=batch.input_ids, positions=batch.positions)
    if done.output is None or batch.logits_indices.shape[0] == done.output.shape[0]:
        # Every token samples (a decode batch): all-token logits are already the sampled rows, in order.
        return done
    return done._replace(output=done.output.index_select(0, batch.logits_indices))
