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
  A backend whose ``graph_strategy()`` is a
  :class:`~paged_core.graph.CompiledStrategy` (the example backend's) also
  gets the batches its graph support admits compiled by that strategy, per
  capture size (:mod:`paged_core.runner.compiled_executor`).
* ``device``: :class:`~paged_core.graph.GraphRunner` with the backend's own
  ``graph_strategy()`` (device graphs, CUDA/HIP/XPU, for the in-tree GPU
  backends; a vendor's strategy otherwise), captured largest-first at start,
  for the batches the backend's declared ``graph_support`` admits (uniform
  decode, or any batch up to the largest capture size); every other batch
  runs eagerly, and each fallback is counted with its reason.
* ``piecewise`` (engine option; see :mod:`paged_core.runner.piece_graphs` and
  :mod:`paged_core.runner.compiled_pieces`): the steps a whole-step graph does
  not hold (prefill, mixed, prompt chunks, verify rows) run as the fused
  decoder's pieces between attention calls, captured per size (``device``) or
  compiled once with dynamic shapes (``compiled``), attention eager between
  them with the step's real metadata.
* ``auto``: ``device`` where the backend's strategy can run and the device has
  device graphs, else ``eager`` (on CPUs the fused eager step beat
  compilation when measured; see the README).

A strategy that raises while capturing or replaying a size leaves that size
to the fallback (counted as ``graph strategy capture raised ...``; see
:mod:`paged_core.graph.runner`); a backend that declares capture without a
usable strategy is refused by ``device`` and reported by ``paged backends``
(:mod:`paged_core.graph.strategy_check`).
"""

from __future__ import annotations

from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.errors import UnsupportedConfigError
from paged_core.runner.compiled_executor import CompiledExecutor
from paged_core.runner.device_executor import DeviceGraphExecutor
from paged_core.runner.forward import ModelForward
from paged_core.runner.graph_modes import (
    compiled_strategy,
    device_graph_refusal,
    device_strategy,
    resolve_graph_mode,
    resolve_piecewise,
)
from paged_core.runner.step_executor import StepExecutor, StepStats

__all__ = [
    "CompiledExecutor",
    "DeviceGraphExecutor",
    "StepExecutor",
    "StepStats",
    "device_graph_refusal",
    "make_executor",
    "resolve_graph_mode",
]


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
    piecewise: bool | None = None,
    max_num_tokens: int | None = None,
) -> StepExecutor:
    """The executor for ``mode`` (resolved against the backend first), with the backend's strategy where it runs.

    ``piecewise`` (see :func:`~paged_core.runner.graph_modes.resolve_piecewise`) runs the steps whole-step
    graphs do not hold as pieces; ``max_num_tokens`` (the step's token budget) bounds their default sizes.
    """
    resolved = resolve_graph_mode(mode, backend)
    pieces = resolve_piecewise(piecewise, resolved, backend, forward)
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
            strategy=compiled_strategy(backend),
            max_model_len=max_model_len,
            capture_sizes=capture_sizes,
            piecewise=pieces,
        )
    if resolved == "device":
        return DeviceGraphExecutor(
            forward,
            backend,
            kv_caches,
            device_strategy(backend),
            block_size=block_size,
            max_blocks_per_seq=max_blocks_per_seq,
            max_num_reqs=max_num_reqs,
            max_model_len=max_model_len,
            sizes=capture_sizes,
            piecewise=pieces,
            max_num_tokens=max_num_tokens if max_num_tokens is not None else max_num_reqs,
        )
    return StepExecutor(forward, backend, kv_caches)
