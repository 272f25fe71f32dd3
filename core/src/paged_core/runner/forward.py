"""The two model paths a step can take: the fused decoder, or transformers' own modules.

Both (:class:`TransformersForward` and :class:`~paged_core.runner.fused.FusedDecoder`) have
``forward(metadata, input_ids, positions, kv_caches, logits_indices) -> logits``
(every token's logits when ``logits_indices`` is ``None``). ``model_impl`` chooses:
``fused`` (refused, with the reason, for a model the fused decoder does not know),
``transformers``, or ``auto`` (fused when it can, else transformers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Protocol

import torch

from paged_core.config import MODEL_IMPLS
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import ConfigError, UnsupportedConfigError
from paged_core.runner.attention import ForwardContext, forward_context
from paged_core.runner.experts import experts_step, route_model_experts
from paged_core.runner.fused import FusedDecoder, fused_refusal, make_decoder
from paged_core.runner.kv_rotation import rotating
from paged_core.runner.packed_experts import packed_experts_modules

log = logging.getLogger("paged.engine")


class ModelForward(Protocol):
    """One model forward over a step's flattened tokens."""

    name: str

    def forward(
        self,
        metadata: AttentionMetadata,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        logits_indices: torch.Tensor | None = None,
        layer_metadata: Sequence[AttentionMetadata] | None = None,
    ) -> torch.Tensor:
        """Logits of ``logits_indices`` (every token's when ``None``); ``layer_metadata[i]``, when given, is
        layer ``i``'s metadata (models with several KV-cache groups), else every layer reads ``metadata``."""
        ...


class TransformersForward:
    """transformers' modules with attention routed into the backend (any decoder transformers defines), and
    the experts of MoE layers through the backend's ``experts`` op where their layout allows
    (:mod:`paged_core.runner.experts`)."""

    name = "transformers"

    def __init__(self, model: Any, backend: AttentionBackend, specs: list[AttentionSpec]) -> None:
        self.model = model
        self.backend = backend
        self.specs = specs
        self.ops = backend.fused_ops()
        self.attend = rotating(backend.forward, self.ops)
        self.experts = route_model_experts(model, self.ops)
        """Which experts modules run the backend's ``experts``, and which keep transformers' (with the reason)."""
        self.packed_experts = packed_experts_modules(model) if isinstance(model, torch.nn.Module) else []
        for _, module in self.packed_experts:  # a GGUF's experts kept packed: packed for the backend once
            module.bind(self.ops)

    def forward(
        self,
        metadata: AttentionMetadata,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        logits_indices: torch.Tensor | None = None,
        layer_metadata: Sequence[AttentionMetadata] | None = None,
    ) -> torch.Tensor:
        ctx = ForwardContext(self.backend, kv_caches, self.specs, metadata, layer_metadata, self.attend)
        routed = self.experts.routed or self.packed_experts
        with forward_context(ctx), experts_step(self.ops) if routed else nullcontext():
            result = self.model(
                input_ids=input_ids.unsqueeze(0),
                position_ids=positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=logits_indices if logits_indices is not None else 0,
            )
        logits: torch.Tensor = result.logits[0]
        return logits


def model_path(model_impl: str, model: Any) -> str:
    """The path :func:`make_forward` takes for ``model_impl``: ``fused`` or ``transformers`` (``fused`` when
    asked for, even where :func:`make_forward` will refuse it)."""
    if model_impl == "transformers" or (model_impl == "auto" and fused_refusal(model) is not None):
        return "transformers"
    return "fused"


def make_forward(
    model_impl: str,
    model: Any,
    backend: AttentionBackend,
    specs: list[AttentionSpec],
    max_positions: int,
    decoders: dict[tuple[str, int], FusedDecoder] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ModelForward:
    """The model path ``model_impl`` asks for; ``decoders`` caches fused decoders across engines of one model.

    ``reduce`` is the tensor-parallel all-reduce the fused decoder applies after its row-parallel
    projections (the transformers path has it as hooks on those modules already).
    """
    if model_impl not in MODEL_IMPLS:
        raise ConfigError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}; got {model_impl!r}")
    if model_impl == "transformers":
        return TransformersForward(model, backend, specs)
    reason = fused_refusal(model)
    if reason is not None:
        if model_impl == "fused":
            raise UnsupportedConfigError(f"model_impl='fused' refused: {reason}; use 'transformers' or 'auto'")
        log.info("model path: transformers (%s)", reason)
        return TransformersForward(model, backend, specs)
    key = (backend.name, max_positions)
    cache = decoders if decoders is not None else {}
    decoder = cache.get(key)
    if decoder is None or decoder.backend is not backend:
        decoder = make_decoder(model, backend, specs, max_positions, reduce=reduce)
        cache[key] = decoder
    log.info("model path: fused decoder (ops: %s)", decoder.ops.name)
    return decoder
