"""How a step runs: eagerly, compiled with ``torch.compile``, or replayed from device graphs.

``graph_mode`` (engine option; ``--graph-mode``, ``--enforce-eager`` = ``eager``):

* ``eager``: the model path is called as is.
* ``compiled``: ``torch.compile`` (inductor) of the whole step with dynamic
  token and row dimensions, compiled at start for three warm-up batches (one
  token, one row, several rows: torch specialises dimensions of size 1; see
  :mod:`paged_core.runner.warmup_batch`), then no more unless a backend's
  ops branch on a size (the CPU linear at its row limit); cached on disk by
  :mod:`paged_core.runner.compile_cache`. The attention of a backend
  declaring no graph capture is never traced (see
  :class:`~paged_core.runner.fused.FusedDecoder`): the layer ops around it
  are compiled as pieces.
* ``device``: :class:`~paged_core.graph.GraphRunner` with device graphs
  (CUDA/HIP/XPU) for uniform decode batches, captured largest-first into one
  pool at start; every other batch runs eagerly, and each fallback is counted
  with its reason.
* ``auto``: ``device`` where the backend and device can capture, else ``eager``
  (on CPUs the fused eager step beat compilation when measured; see the README).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from paged_core.config import GRAPH_MODES
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import GraphSupport
from paged_core.contract.graph_strategy import GraphCaptureStrategy
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import ConfigError, UnsupportedConfigError
from paged_core.graph import DeviceGraphStrategy, GraphRunner, StaticInput, capture_sizes
from paged_core.graph.device_strategy import graph_module
from paged_core.runner.batch import StepBatch
from paged_core.runner.forward import ModelForward
from paged_core.runner.warmup_batch import WARM_UP_SHAPES, warm_up_batch

log = logging.getLogger("paged.engine")


@dataclass
class StepStats:
    """What the executor did, for ``/metrics`` and logs."""

    steps: int = 0
    replays: int = 0
    eager_steps: int = 0
    fallback_reasons: Counter[str] = field(default_factory=Counter)
    warmup_seconds: float = 0.0


def device_graph_refusal(backend: AttentionBackend) -> str | None:
    """Why ``graph_mode='device'`` cannot run on this backend and device, or ``None`` when it can."""
    support = backend.capabilities().graph_support
    if support == GraphSupport.NEVER:
        return f"backend {backend.name!r} declares graph_support=never"
    try:
        graph_module(backend.device.type)
    except UnsupportedConfigError as exc:
        return f"device {backend.device}: {exc}"
    return None


def resolve_graph_mode(mode: str, backend: AttentionBackend) -> str:
    """The concrete mode for ``mode`` on ``backend``; refuses an unknown or impossible one with the working modes."""
    if mode not in GRAPH_MODES:
        raise ConfigError(f"graph_mode must be one of {', '.join(GRAPH_MODES)}; got {mode!r}")
    refusal = device_graph_refusal(backend)
    if mode == "device" and refusal is not None:
        raise UnsupportedConfigError(f"graph_mode='device' refused: {refusal}; modes that work here: eager, compiled")
    if mode == "auto":
        return "device" if refusal is None else "eager"
    return mode


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
        return self.forward.forward(
            batch.metadata, batch.input_ids, batch.positions, self.kv_caches, batch.logits_indices
        )


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


def _without_duck_sizing(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` with dynamo's duck sizing off while it runs (and so while it traces).

    Duck sizing gives dimensions that are equal while tracing one symbol and
    guards on that equality: a KV cache of 256 blocks next to a 256-row batch
    buffer made every engine with another block count recompile the shared
    step. Without it only the equalities the step itself needs are guarded.
    """
    from torch.fx.experimental import _config as fx_config

    def call(*args: Any) -> torch.Tensor:
        before = fx_config.use_duck_shape
        fx_config.use_duck_shape = False  # a plain attribute swap: a few microseconds a step
        try:
            return fn(*args)
        finally:
            fx_config.use_duck_shape = before

    return call


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
    ) -> None:
        super().__init__(forward, backend, kv_caches)
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_seq = max_blocks_per_seq
        with torch.inference_mode(False):  # like the runner's buffers (dynamo guards on dispatch keys)
            self._sampled = torch.zeros(max(max_num_reqs, 2), dtype=torch.int64, device=backend.device)
        self.compile_cache = compile_cache
        shared = getattr(forward, "shared", None)
        compiled = shared.get("compiled") if shared is not None else None
        if compiled is None:
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
            compiled = _without_duck_sizing(torch.compile(step, dynamic=True, fullgraph=False))
            if shared is not None:
                shared["compiled"] = compiled
        self._compiled: Callable[..., torch.Tensor] = compiled

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
        if self.compile_cache is not None:
            self.compile_cache.seal()
        self.stats.warmup_seconds = time.perf_counter() - start

    def run(self, batch: StepBatch) -> torch.Tensor:
        self.stats.steps += 1
        self.stats.replays += 1
        return self._call(batch)

    def _call(self, batch: StepBatch) -> torch.Tensor:
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


class DeviceGraphExecutor(StepExecutor):
    """Device graphs for uniform decode batches through :class:`GraphRunner`; everything else eager."""

    mode = "device"

    def __init__(
        self,
        forward: ModelForward,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        *,
        block_size: int,
        max_blocks_per_seq: int,
        max_num_reqs: int,
        max_model_len: int,
        sizes: tuple[int, ...] | None,
        strategy: GraphCaptureStrategy | None = None,
    ) -> None:
        super().__init__(forward, backend, kv_caches)
        fwd, caches = forward.forward, kv_caches

        def step(metadata: AttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return fwd(metadata, input_ids, positions, caches, None)

        self.graphs = GraphRunner(
            backend,
            step,
            block_size=block_size,
            max_blocks_per_seq=max_blocks_per_seq,
            capture_sizes=capture_sizes(max_num_reqs, list(sizes) if sizes else None),
            device=backend.device,
            inputs=[StaticInput("input_ids", (), torch.int64), StaticInput("positions", (), torch.int64)],
            max_model_len=max_model_len,
            strategy=strategy if strategy is not None else DeviceGraphStrategy(backend.device.type),
        )

    def warm_up(self) -> None:
        start = time.perf_counter()
        sizes = self.graphs.sizes
        with tqdm(total=len(sizes), desc="capturing device graphs", unit="graph", disable=None, leave=False) as bar:
            self.graphs.capture_all(on_captured=lambda n: bar.update(1))
        self.stats.warmup_seconds = time.perf_counter() - start
        log.info(
            "captured %d device graphs (sizes %s) in %.1f s",
            len(self.graphs.sizes),
            self.graphs.sizes,
            self.stats.warmup_seconds,
        )

    def run(self, batch: StepBatch) -> torch.Tensor:
        self.stats.steps += 1
        md = batch.metadata
        if batch.logits_indices.shape[0] != md.num_actual_tokens:
            reason = "a row does not sample (chunked prefill)"
        elif md.uniform_query_len != 1:
            reason = "not a uniform decode batch"
        else:
            before, reasons = self.graphs.stats.replays, Counter(self.graphs.stats.fallback_reasons)
            # Every row of a uniform decode batch samples, so all-token logits are the sampled rows' logits.
            logits = self.graphs.run(md, input_ids=batch.input_ids, positions=batch.positions)
            if self.graphs.stats.replays > before:
                self.stats.replays += 1
            else:
                self.stats.eager_steps += 1
                self.stats.fallback_reasons.update(self.graphs.stats.fallback_reasons - reasons)
            return logits
        self.stats.eager_steps += 1
        self.stats.fallback_reasons[reason] += 1
        return self._eager(batch)


def make_executor(
    mode: str,
    forward: ModelForward,
    backend: AttentionBackend,
    kv_caches: list[torch.Tensor],
    *,
    block_size: int,
    max_blocks_per_seq: int,
    max_num_reqs: int,
    max_model_len: int,
    capture_sizes: tuple[int, ...] | None = None,
    compile_cache: Any = None,
) -> StepExecutor:
    """The executor for ``mode`` (resolved against the backend first)."""
    resolved = resolve_graph_mode(mode, backend)
    if resolved == "compiled" and forward.name != "fused":
        # transformers' modules find the step's metadata through a thread-local context, which dynamo
        # cannot hold as a graph input; device graphs only record kernels, so they are fine.
        raise UnsupportedConfigError(
            f"graph_mode='compiled' needs the fused decoder, but this model runs on the {forward.name} path; "
            "modes that work here: eager" + (", device" if device_graph_refusal(backend) is None else "")
        )
    if resolved == "compiled":
        return CompiledExecutor(
            forward,
            backend,
            kv_caches,
            block_size,
            compile_cache,
            max_num_reqs=max_num_reqs,
            max_blocks_per_seq=max_blocks_per_seq,
        )
    if resolved == "device":
        return DeviceGraphExecutor(
            forward,
            backend,
            kv_caches,
            block_size=block_size,
            max_blocks_per_seq=max_blocks_per_seq,
            max_num_reqs=max_num_reqs,
            max_model_len=max_model_len,
            sizes=capture_sizes,
        )
    return StepExecutor(forward, backend, kv_caches)
