"""The reference backend (pure torch, the conformance oracle) and its dense attention helper."""

from __future__ import annotations

from paged_core.reference.backend import ReferenceBackend
from paged_core.reference.dense import dense_causal_attention, visibility_mask

__all__ = ["ReferenceBackend", "dense_causal_attention", "visibility_mask"]
