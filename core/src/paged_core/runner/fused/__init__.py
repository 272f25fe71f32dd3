"""The engine's own decoder for the model families it knows, built from a loaded transformers model.

Per layer it runs a handful of backend kernels (:class:`~paged_core.contract.fused_ops.FusedOps`):
RMS norm fused with the residual add, one merged QKV projection, rotary, paged attention, one
merged gate/up projection and the gated activation, or, in the MoE layers of Mixtral and Qwen3-MoE, the
router's projection and the backend's routed experts (:mod:`~paged_core.runner.fused.moe_layer`).
Gemma2/Gemma3 run the same pieces with Gemma's norms, scaled embedding and GELU
(:mod:`~paged_core.runner.fused.gemma`).
Everything else runs on transformers' own modules (:mod:`paged_core.runner.model_runner` picks the path;
``model_impl`` forces one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.runner.fused.decoder import FusedDecoder
from paged_core.runner.fused.families import fused_refusal
from paged_core.runner.fused.gemma import GemmaDecoder
from paged_core.runner.fused.gemma_family import GEMMA_FAMILIES


def make_decoder(
    model: Any,
    backend: AttentionBackend,
    specs: list[AttentionSpec],
    max_positions: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> FusedDecoder:
    """The fused decoder for ``model``'s family (Gemma's or the Llama-family one); refused as they refuse."""
    cls = GemmaDecoder if type(model).__name__ in GEMMA_FAMILIES else FusedDecoder
    return cls(model, backend, specs, max_positions, reduce=reduce)


__all__ = ["FusedDecoder", "GemmaDecoder", "fused_refusal", "make_decoder"]
