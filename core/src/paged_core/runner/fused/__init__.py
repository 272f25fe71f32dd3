"""The engine's own decoder for the model families it knows, built from a loaded transformers model.

Per layer it runs a handful of backend kernels (:class:`~paged_core.contract.fused_ops.FusedOps`):
RMS norm fused with the residual add, one merged QKV projection, rotary, paged attention, one
merged gate/up projection and the gated activation, or, in the MoE layers of Mixtral and Qwen3-MoE, the
router's projection and the backend's routed experts (:mod:`~paged_core.runner.fused.moe_layer`).
Everything else runs on transformers' own modules (:mod:`paged_core.runner.model_runner` picks the path;
``model_impl`` forces one).
"""

from __future__ import annotations

from paged_core.runner.fused.decoder import FusedDecoder
from paged_core.runner.fused.families import fused_refusal

__all__ = ["FusedDecoder", "fused_refusal"]
