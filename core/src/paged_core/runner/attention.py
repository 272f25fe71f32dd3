"""Routing transformers' attention into a paged backend through its attention-function registry.

Every decoder model in transformers calls ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``
with the layer module and ``[batch, heads, tokens, head_dim]`` projections after rotary
embeddings. We register one function under :data:`ATTN_IMPLEMENTATION`; it looks up the
step's :class:`ForwardContext` (set by the model runner around each forward), writes the
step's keys and values into that layer's paged cache and returns the backend's attention.
Because the name is not a mask implementation, transformers also skips building masks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import PagedError
from paged_core.runner.kv_rotation import AttendFn

ATTN_IMPLEMENTATION = "paged"


@dataclass
class ForwardContext:
    """What attention needs during one forward: the backend, per-layer caches and specs, and the step's metadata."""

    backend: AttentionBackend
    kv_caches: list[torch.Tensor]
    specs: list[AttentionSpec]
    metadata: AttentionMetadata
    layer_metadata: Sequence[AttentionMetadata] | None = None
    """Each layer's metadata when the model has several KV-cache groups (else every layer reads ``metadata``)."""
    attend: AttendFn | None = None
    """What each layer calls: the backend's ``forward`` with quantized caches' rotation (runner/kv_rotation.py);
    ``None``: ``backend.forward`` itself."""


_state = threading.local()


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[None]:
    """Make ``ctx`` the current step's context for the duration of one model forward."""
    previous = getattr(_state, "ctx", None)
    _state.ctx = ctx
    try:
        yield
    finally:
        _state.ctx = previous


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: ``[1, H, T, D]`` in, ``[1, T, H, D]`` out (as transformers expects)."""
    ctx: ForwardContext | None = getattr(_state, "ctx", None)
    if ctx is None:
        raise PagedError("paged attention called outside a model-runner step (no forward context)")
    layer: int = module.layer_idx  # type: ignore[assignment]
    # Token-major views, no copies: the contract accepts strided inputs.
    spec = ctx.specs[layer]
    # The model states its window and soft cap per call; they must be what the backend was checked for.
    window, cap = kwargs.get("sliding_window"), kwargs.get("softcap")
    if (window or None) != spec.sliding_window or (cap or None) != spec.logits_soft_cap:
        raise PagedError(
            f"layer {layer}: the model asks for sliding_window={window}, softcap={cap} but the layer was "
            f"planned with {spec.sliding_window}, {spec.logits_soft_cap}"
        )
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    metadata = ctx.layer_metadata[layer] if ctx.layer_metadata else ctx.metadata
    attend = ctx.attend or ctx.backend.forward
    out = attend(q, k, v, ctx.kv_caches[layer], metadata, spec)
    return out.unsqueeze(0), None


_registered = False


def register_paged_attention() -> str:
    """Register :func:`paged_attention_forward` with transformers (idempotent); returns the implementation name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
        _registered = True
    return ATTN_IMPLEMENTATION


def attention_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's attention modules, ordered by ``layer_idx`` (every transformers decoder numbers them)."""
    layers: dict[int, torch.nn.Module] = {}
    for mod in model.modules():
        idx = getattr(mod, "layer_idx", None)
        if isinstance(idx, int) and hasattr(mod, "head_dim") and hasattr(mod, "scaling"):
            layers.setdefault(idx, mod)
    if not layers:
        raise PagedError(f"{type(model).__name__}: found no attention layers (modules with layer_idx and head_dim)")
    if sorted(layers) != list(range(len(layers))):
        raise PagedError(f"{type(model).__name__}: attention layer indices are not 0..N-1: {sorted(layers)}")
    return [layers[i] for i in range(len(layers))]


def layer_specs(model: torch.nn.Module) -> list[AttentionSpec]:
    """One :class:`AttentionSpec` per attention layer, read from the modules and the model config."""
    config: Any = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_heads = int(text_config.num_attention_heads)
    num_kv_heads = int(getattr(text_config, "num_key_value_heads", None) or num_heads)
    # Models with per-layer types keep the window on the module; others (e.g. Mistral) read it from the config.
    config_window = getattr(text_config, "sliding_window", None)
    if getattr(text_config, "use_sliding_window", True) is False:
        config_window = None
    specs = []
    for mod in attention_layers(model):
        window = getattr(mod, "sliding_window", config_window)
        soft_cap = getattr(mod, "attn_logit_softcapping", None)
        specs.append(
            AttentionSpec(
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_size=int(mod.head_dim),  # type: ignore[arg-type]
                scale=float(mod.scaling),  # type: ignore[arg-type]
                sliding_window=int(window) if window else None,
                logits_soft_cap=float(soft_cap) if soft_cap else None,
            )
        )
    return specs
