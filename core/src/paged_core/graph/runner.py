"""GraphRunner: the core's side of graph capture (sizes, static buffers, warm-up, dispatch, fallback).

The rules a capturable backend obeys inside a captured step (shapes, frozen
host ints, padding, no host reads) are part of the batch contract: see
:mod:`paged_core.contract.metadata`. :meth:`AttentionBackend.prepare` is
called by the runner, outside the graph, before every step (eager or
replayed), with the live batch's host copies (``query_start_loc_cpu``,
``seq_lens_cpu``); the step must not call it.

The strategy is the backend's (or a vendor's) code, so the runner does not
trust it: a strategy that raises while capturing or replaying a size leaves
that size to eager execution for good, and every such step is counted under
the failure's reason (``graph strategy capture raised RuntimeError``); the
request it served never sees the error.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import GraphSupport
from paged_core.contract.graph_strategy import GraphCaptureStrategy, StepFn
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import ConfigError
from paged_core.graph.capture_sizes import padded_size
from paged_core.graph.static_batch import NUM_METADATA_ARGS, StaticBatch, StaticInput

log = logging.getLogger("paged.graph")

Step = Callable[..., torch.Tensor]
"""``step(metadata, **inputs) -> Tensor`` whose first dimension is tokens."""


@dataclass
class GraphStats:
    """What :meth:`GraphRunner.run` did, for tests and logs."""

    replays: int = 0
    eager_fallbacks: int = 0
    replays_by_size: Counter[int] = field(default_factory=Counter)
    fallback_reasons: Counter[str] = field(default_factory=Counter)


class Replay(NamedTuple):
    """What :meth:`GraphRunner.replay` did with one batch."""

    output: torch.Tensor | None
    """The real tokens' output, or ``None`` when the batch was not replayed (the caller runs it another way)."""
    reason: str
    """Why it was not replayed (``""`` when it was)."""
    failed: bool
    """The strategy raised for this size (now or at capture), as opposed to a batch it was never meant to take."""


class GraphRunner:
    """Runs a step function through the backend's capture strategy when the batch allows it.

    ``capture_sizes`` (see :func:`~paged_core.graph.capture_sizes.capture_sizes`) are
    the padded token counts that get a graph; buffers are allocated once at
    the largest. ``inputs`` describe the per-token tensors the step takes as
    keyword arguments besides the metadata. ``strategy`` overrides
    ``backend.graph_strategy()``; ``support`` narrows the backend's declared
    graph support (uniform decode only, when pieces take the rest). Nothing is captured until
    :meth:`capture_all`; until then (and always for ``GraphSupport.NEVER``)
    :meth:`run` is eager.
    """

    def __init__(
        self,
        backend: AttentionBackend,
        step: Step,
        *,
        block_size: int,
        max_blocks_per_seq: int,
        capture_sizes: Sequence[int],
        device: torch.device | str | None = None,
        inputs: Sequence[StaticInput] = (),
        max_model_len: int | None = None,
        strategy: GraphCaptureStrategy | None = None,
        warmup_iters: int = 2,
        support: GraphSupport | None = None,
    ) -> None:
        if block_size <= 0 or max_blocks_per_seq <= 0:
            raise ConfigError(
                f"block_size and max_blocks_per_seq must be positive, got {block_size}, {max_blocks_per_seq}"
            )
        sizes = sorted(set(capture_sizes))
        if not sizes or sizes[0] <= 0:
            raise ConfigError(f"capture_sizes must be non-empty and positive, got {list(capture_sizes)}")
        if warmup_iters < 0:
            raise ConfigError(f"warmup_iters must be >= 0, got {warmup_iters}")
        self.backend = backend
        self.step = step
        self.block_size = block_size
        self.sizes = sizes
        declared = backend.capabilities().graph_support
        self.support = declared if support is None else min(support, declared)
        self.max_model_len = max_model_len if max_model_len is not None else block_size * max_blocks_per_seq
        self.strategy = strategy if strategy is not None else backend.graph_strategy()
        if not isinstance(self.strategy, GraphCaptureStrategy):
            raise ConfigError(
                f"backend {backend.name!r}: graph_strategy() returned {type(self.strategy).__name__}, "
                "not a GraphCaptureStrategy"
            )
        self.warmup_iters = warmup_iters
        self.device = torch.device(device) if device is not None else backend.device
        self.buffers = StaticBatch(sizes[-1], max_blocks_per_seq, inputs, self.device)
        self.stats = GraphStats()
        self.failures: dict[int, str] = {}
        """Sizes whose capture or replay raised, with the reason their steps are counted under."""
        self._static_metadata: dict[int, AttentionMetadata] = {}

    def capture_all(self, on_captured: Callable[[int], None] | None = None) -> None:
        """Warm up and capture every size, largest first (so smaller graphs can reuse its pool memory).

        ``on_captured(n)`` is called after each size (a progress bar hangs there). A size whose
        capture raises is logged and left to eager execution (see the module docstring); the step's
        own warm-up calls are the core's and propagate their errors.
        """
        if self.support == GraphSupport.NEVER:
            return
        for n in reversed(self.sizes):
            if (self.strategy.has(n) and n in self._static_metadata) or n in self.failures:
                continue  # done (or failed) in an earlier call; a strategy shared with others is re-captured
            fn, metadata = self._step_fn(n)
            args = self.buffers.args(n)
            self.buffers.fill_padding(n)  # all slots -1: warm-up and capture write nothing to the KV cache
            self.backend.prepare(metadata)
            for _ in range(self.warmup_iters):
                fn(*args)
            try:
                self.strategy.capture(n, fn, args)
            except Exception as exc:  # the strategy is a vendor's code: one size failing must not stop serving
                self._fail(n, "capture", exc)
            else:
                self._static_metadata[n] = metadata
            if on_captured is not None:
                on_captured(n)

    def run(self, metadata: AttentionMetadata, **inputs: torch.Tensor) -> torch.Tensor:
        """One step: replay the graph of the padded size if admitted, else call the step eagerly.

        Returns the step's output for the real tokens only (``[:num_actual_tokens]``).
        A replayed output may be a view of a static buffer that the next
        replay overwrites: consume or clone it first.
        """
        done = self.replay(metadata, **inputs)
        if done.output is not None:
            return done.output
        self.backend.prepare(metadata)
        return self.step(metadata, **inputs)[: metadata.num_actual_tokens]

    def replay(self, metadata: AttentionMetadata, **inputs: torch.Tensor) -> Replay:
        """Replay the graph of the padded size if the batch is admitted; never runs the step eagerly.

        A batch not replayed is counted in :attr:`stats` under its reason, and
        the caller runs it (after calling ``backend.prepare`` with its metadata).
        """
        n, reason = self._admit(metadata)
        if n is None:
            return self._not_replayed(reason)
        self.buffers.fill(n, metadata, inputs)
        static = self._static_metadata[n]
        static.query_start_loc_cpu, static.seq_lens_cpu = metadata.query_start_loc_cpu, metadata.seq_lens_cpu
        self.backend.prepare(static)
        try:
            out = self.strategy.replay(n)
        except Exception as exc:  # as in capture_all: this size turns eager, the step is run by the caller
            return self._not_replayed(self._fail(n, "replay", exc))
        self.stats.replays += 1
        self.stats.replays_by_size[n] += 1
        return Replay(out[: metadata.num_actual_tokens], "", False)

    def reset(self) -> None:
        """Drop every captured graph (and forget failed sizes); :meth:`run` is eager until :meth:`capture_all`."""
        self.strategy.reset()
        self._static_metadata.clear()
        self.failures.clear()

    def _fail(self, n: int, phase: str, exc: Exception) -> str:
        """Mark size ``n`` failed for good; returns the reason its steps are counted under."""
        reason = f"graph strategy {phase} raised {type(exc).__name__}"
        self.failures[n] = reason
        self._static_metadata.pop(n, None)
        log.warning(
            "graph strategy %r: %s of size %d raised %s: %s; batches of that size run eagerly",
            getattr(self.strategy, "name", type(self.strategy).__name__),
            phase,
            n,
            type(exc).__name__,
            exc,
        )
        return reason

    def _not_replayed(self, reason: str) -> Replay:
        self.stats.eager_fallbacks += 1
        self.stats.fallback_reasons[reason] += 1
        return Replay(None, reason, reason in self.failures.values())

    def _admit(self, metadata: AttentionMetadata) -> tuple[int | None, str]:
        """The padded size to replay, or ``None`` and why the batch runs eagerly."""
        if self.support == GraphSupport.NEVER:
            return None, "backend graph_support is never"
        tokens = metadata.num_actual_tokens
        if tokens <= 0:
            return None, "empty batch"
        if metadata.block_size != self.block_size:
            return None, "block size differs from the captured one"
        if self.support == GraphSupport.UNIFORM_DECODE and not (
            metadata.uniform_query_len == 1 or (metadata.num_prefills == 0 and metadata.num_decodes == tokens)
        ):
            return None, "not a uniform decode batch"
        n = padded_size(tokens, self.sizes)
        if n is None:
            return None, "more tokens than the largest capture size"
        if metadata.block_table.shape[1] > self.buffers.max_blocks_per_seq:
            return None, "block table wider than max_blocks_per_seq"
        if metadata.max_seq_len > self.max_model_len:
            return None, "max_seq_len above max_model_len"
        if n in self.failures:
            return None, self.failures[n]
        if not self.strategy.has(n) or n not in self._static_metadata:
            return None, "size not captured"
        return n, ""

    def _frozen_ints(self, n: int) -> dict[str, Any]:
        """The host ints a size-``n`` graph sees, as the module docstring promises."""
        uniform = self.support == GraphSupport.UNIFORM_DECODE
        return {
            "block_size": self.block_size,
            "num_decodes": n if uniform else 0,
            "num_decode_tokens": n if uniform else 0,
            "num_prefills": 0 if uniform else n,
            "num_actual_tokens": n,
            "max_query_len": 1 if uniform else n,
            "uniform_query_len": 1 if uniform else 0,
            "max_seq_len": self.max_model_len,
        }

    def _step_fn(self, n: int) -> tuple[StepFn, AttentionMetadata]:
        """Adapt ``step(metadata, **inputs)`` to the strategy's ``fn(*args)`` form; also the static metadata.

        The closure holds only plain locals (no ``self``) so a compiler has
        nothing mutable to guard on.
        """
        names = [i.name for i in self.buffers.inputs]
        frozen = self._frozen_ints(n)
        step = self.step

        def fn(*args: torch.Tensor) -> torch.Tensor:
            metadata = AttentionMetadata(args[0], args[1], args[2], args[3], **frozen)
            return step(metadata, **dict(zip(names, args[NUM_METADATA_ARGS:], strict=True)))

        args = self.buffers.args(n)
        return fn, AttentionMetadata(args[0], args[1], args[2], args[3], **frozen)
