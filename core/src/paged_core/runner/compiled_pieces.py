"""Piecewise compilation: the fused decoder's pieces under ``torch.compile``, attention eager between them.

A backend whose attention cannot be traced (it reads metadata on the host, as the CPU backends do) still
gets its layers compiled: the step is split at the attention calls (see
:meth:`~paged_core.runner.fused.FusedDecoder.first`), the pieces are compiled once each with a dynamic
token dimension, and every step (prefill, decode, mixed, prompt chunks, speculative verify rows) runs the
compiled pieces around the backend's eager attention with the step's real metadata. One compiled
``between`` piece serves every layer pair (the layers are its arguments, guarded by shape), so a
30-layer model compiles three pieces, twice (dynamo specialises a one-token step), not 30.
The final norm and LM head run eagerly over the sampled rows only (a count that is often 0 or 1,
which would each need a compile of their own for one matrix product).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.runner.batch import StepBatch
from paged_core.runner.fused import FusedDecoder

Piece = Callable[..., Any]


def without_duck_sizing(fn: Piece) -> Piece:
    """``fn`` with dynamo's duck sizing off while it runs (and so while it traces).

    Duck sizing gives dimensions that are equal while tracing one symbol and
    guards on that equality: a KV cache of 256 blocks next to a 256-row batch
    buffer made every engine with another block count recompile the shared
    step. Without it only the equalities the step itself needs are guarded.
    """
    from torch.fx.experimental import _config as fx_config

    def call(*args: Any) -> Any:
        before = fx_config.use_duck_shape
        fx_config.use_duck_shape = False  # a plain attribute swap: a few microseconds a step
        try:
            return fn(*args)
        finally:
            fx_config.use_duck_shape = before

    return call


class CompiledPieces:
    """The decoder's ``first``, ``between`` and ``last`` pieces compiled (shared by engines on one decoder)."""

    def __init__(self, decoder: FusedDecoder, backend: AttentionBackend, kv_caches: list[torch.Tensor]) -> None:
        self.decoder = decoder
        self.backend = backend
        self.kv_caches = kv_caches
        pieces = decoder.shared.get("compiled_pieces")
        if pieces is None:
            pieces = tuple(
                without_duck_sizing(torch.compile(fn, dynamic=True, fullgraph=False))
                for fn in (decoder.first, decoder.between, decoder.last)
            )
            decoder.shared["compiled_pieces"] = pieces
        self.first, self.between, self.last = pieces

    def run(self, batch: StepBatch) -> torch.Tensor:
        """Logits ``[K, V]`` of the batch's sampled rows."""
        decoder, md, caches, positions = self.decoder, batch.metadata, self.kv_caches, batch.positions
        self.backend.prepare(md)
        layers, specs = decoder.layers, decoder.specs
        q, k, v, residual = self.first(batch.input_ids, positions)
        last = len(layers) - 1
        for i in range(last):
            attn = decoder.attend(i, q, k, v, caches[i], md)
            q, k, v, residual = self.between(layers[i], layers[i + 1], specs[i + 1], attn, residual, positions)
        hidden, residual = self.last(decoder.attend(last, q, k, v, caches[last], md), residual)
        return decoder.logits(hidden, residual, batch.logits_indices)
