"""Piecewise capture: the fused decoder's pieces captured per token count, attention eager between them.

For steps a whole-step graph cannot hold (a backend capturing uniform decode only, given a prefill, a
prompt chunk, a mixed batch or speculative verify rows), the step is split at the attention calls
(:meth:`~paged_core.runner.fused.FusedDecoder.first`, ``between``, ``last``): each piece is captured
through the backend's strategy once per capture size (key ``("piece", size, index)``), reading and
writing static buffers, and replayed on the step padded to that size; the backend's attention runs
eagerly between the pieces with the step's real metadata and real token count, so it sees exactly
what an eager step gives it. The pieces are row-wise, so padding rows change nothing in the real ones.
The final norm and LM head run eagerly over the sampled rows.

As with whole-step graphs, the core owns sizes, buffers, warm-up, dispatch and fallback; a size whose
capture or replay raises is left to the caller's eager path for good, counted under the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.graph_strategy import GraphCaptureStrategy, StepFn
from paged_core.errors import UnsupportedConfigError
from paged_core.graph import Replay
from paged_core.graph.capture_sizes import padded_size
from paged_core.runner.batch import StepBatch
from paged_core.runner.fused import FusedDecoder

log = logging.getLogger("paged.graph")


def piece_refusal(decoder: object) -> str | None:
    """Why piecewise capture cannot split this model path, or ``None`` when it can."""
    if not isinstance(decoder, FusedDecoder):
        return f"piecewise capture needs the fused decoder, not the {getattr(decoder, 'name', '?')} path"
    if len({(s.num_heads, s.num_kv_heads, s.head_size) for s in decoder.specs}) != 1:
        return "piecewise capture needs every layer's attention to have the same shape"
    return None


class PieceGraphs:
    """The pieces of the step, captured by ``strategy`` for every size in ``sizes``."""

    def __init__(
        self,
        decoder: FusedDecoder,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        strategy: GraphCaptureStrategy,
        sizes: Sequence[int],
        warmup_iters: int = 2,
    ) -> None:
        reason = piece_refusal(decoder)
        if reason is not None:
            raise UnsupportedConfigError(reason)
        self.decoder = decoder
        self.backend = backend
        self.kv_caches = kv_caches
        self.strategy = strategy
        self.sizes = sorted(set(sizes))
        self.warmup_iters = warmup_iters
        self.failures: dict[int, str] = {}
        self.replays_by_size: dict[int, int] = {}
        self._captured: set[int] = set()
        spec, n, dtype, device = decoder.specs[0], self.sizes[-1], decoder.embed.dtype, decoder.embed.device
        hidden = decoder.embed.shape[1]
        with torch.inference_mode(False):  # like the runner's buffers, so they can be written under any mode
            self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
            self.positions = torch.zeros(n, dtype=torch.int64, device=device)
            self.q = torch.zeros(n, spec.num_heads, spec.head_size, dtype=dtype, device=device)
            self.k = torch.zeros(n, spec.num_kv_heads, spec.head_size, dtype=dtype, device=device)
            self.v = torch.zeros_like(self.k)
            self.attn = torch.zeros(n, spec.num_heads * spec.head_size, dtype=dtype, device=device)
            self.residual = torch.zeros(n, hidden, dtype=dtype, device=device)
            self.hidden = torch.zeros(n, hidden, dtype=dtype, device=device)

    @property
    def num_pieces(self) -> int:
        return len(self.decoder.layers) + 1

    def capture_all(self, on_captured: Callable[[int], None] | None = None) -> None:
        """Warm up and capture every piece of every size, largest size first; a size that raises turns eager."""
        for n in reversed(self.sizes):
            if n in self._captured or n in self.failures:
                continue
            try:
                for index in range(self.num_pieces):
                    fn, args = self._piece(n, index)
                    for _ in range(self.warmup_iters):
                        fn(*args)
                    self.strategy.capture(("piece", n, index), fn, args)
            except Exception as exc:  # the strategy is a vendor's code: one size failing must not stop serving
                self._fail(n, "capture", exc)
            else:
                self._captured.add(n)
            if on_captured is not None:
                on_captured(n)

    def replay(self, batch: StepBatch) -> Replay:
        """The sampled rows' logits with the pieces replayed, or why the step was not (the caller runs it)."""
        md = batch.metadata
        tokens = md.num_actual_tokens
        n = padded_size(tokens, self.sizes) if tokens > 0 else None
        if n is None:
            return Replay(None, "more tokens than the largest piecewise size", False)
        if n in self.failures:
            return Replay(None, self.failures[n], True)
        if n not in self._captured:
            return Replay(None, "size not captured", False)
        self.input_ids[:tokens].copy_(batch.input_ids[:tokens])
        self.positions[:tokens].copy_(batch.positions[:tokens])
        self.input_ids[tokens:n].zero_()
        self.positions[tokens:n].zero_()
        decoder, caches = self.decoder, self.kv_caches
        q, k, v, attn = self.q[:tokens], self.k[:tokens], self.v[:tokens], self.attn[:tokens]
        self.backend.prepare(md)
        for index in range(self.num_pieces):
            try:
                self.strategy.replay(("piece", n, index))
            except Exception as exc:  # as in capture_all (the caller reruns the step eagerly: same KV writes)
                return Replay(None, self._fail(n, "replay", exc), True)
            if index < len(decoder.layers):
                attn.copy_(decoder.attend(index, q, k, v, caches[index], md).reshape(tokens, -1))
        self.replays_by_size[n] = self.replays_by_size.get(n, 0) + 1
        hidden, residual = self.hidden[:tokens], self.residual[:tokens]
        return Replay(decoder.logits(hidden, residual, batch.logits_indices), "", False)

    def reset(self) -> None:
        """Drop every captured piece (and forget failed sizes)."""
        self.strategy.reset()
        self._captured.clear()
        self.failures.clear()

    def _fail(self, n: int, phase: str, exc: Exception) -> str:
        reason = f"graph strategy {phase} raised {type(exc).__name__}"
        self.failures[n] = reason
        self._captured.discard(n)
        log.warning(
            "graph strategy %r: %s of piecewise size %d raised %s: %s; steps of that size run eagerly",
            getattr(self.strategy, "name", type(self.strategy).__name__),
            phase,
            n,
            type(exc).__name__,
            exc,
        )
        return reason

    def _piece(self, n: int, index: int) -> tuple[StepFn, tuple[torch.Tensor, ...]]:
        """Piece ``index`` for size ``n`` as ``fn(*args)`` over views of the static buffers (written in place).

        The closures hold the decoder and its layers, not ``self``: a compiling strategy guards on what they
        read, and the buffers are arguments.
        """
        decoder = self.decoder
        last = len(decoder.layers)

        def put(outs: tuple[torch.Tensor, ...], into: tuple[torch.Tensor, ...]) -> torch.Tensor:
            for out, buf in zip(outs, into, strict=True):
                buf.copy_(out.reshape(buf.shape))
            return into[0]

        if index == 0:

            def first(ids: torch.Tensor, pos: torch.Tensor, *out: torch.Tensor) -> torch.Tensor:
                return put(decoder.first(ids, pos), out)

            return first, (self.input_ids[:n], self.positions[:n], *self._qkv_res(n))
        if index < last:
            done, layer, spec = decoder.layers[index - 1], decoder.layers[index], decoder.specs[index]

            def between(attn: torch.Tensor, pos: torch.Tensor, *out: torch.Tensor) -> torch.Tensor:
                shaped = attn.view(attn.shape[0], spec.num_heads, spec.head_size)
                return put(decoder.between(done, layer, spec, shaped, out[3], pos), out)

            return between, (self.attn[:n], self.positions[:n], *self._qkv_res(n))
        heads, size = decoder.specs[-1].num_heads, decoder.specs[-1].head_size

        def final(attn: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            return put(decoder.last(attn.view(attn.shape[0], heads, size), residual), (hidden, residual))

        return final, (self.attn[:n], self.hidden[:n], self.residual[:n])

    def _qkv_res(self, n: int) -> tuple[torch.Tensor, ...]:
        return self.q[:n], self.k[:n], self.v[:n], self.residual[:n]
