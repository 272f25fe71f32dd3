"""Gemma2 and Gemma3 (text) in the fused decoder: the same pieces as the Llama families, Gemma's arithmetic.

A Gemma layer differs from a Llama one in what surrounds attention and the MLP, not in the kernels:

* RMS norms multiply by ``1 + w`` in fp32 (``(x * (1 + w)).to(dtype)``). The backend's ``rms_norm`` computes
  ``normed * weight.float()`` then rounds, so the decoder passes ``1 + w`` precomputed in fp32 as the weight.
* four norms a layer: the attention and MLP outputs are normalised (post-attention, post-feedforward) before
  their residual add, and the MLP input has its own (pre-feedforward) norm;
* the embedding is scaled by ``sqrt(hidden)`` rounded to the model dtype (transformers' ``embed_scale``);
* the MLP is gated GELU (tanh approximation), run in torch (the contract's activation is SiLU only);
* Gemma3 normalises q and k per head, and rotates sliding layers with its local base and full layers with
  the global one (one cos/sin table per layer type);
* Gemma2 soft-caps the final logits. Attention's scale (``query_pre_attn_scalar``), windows and soft caps are
  the layer specs' (:func:`~paged_core.runner.attention.layer_specs`), applied by the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.fused_ops import PackedLinear
from paged_core.errors import UnsupportedConfigError
from paged_core.runner.fused.decoder import FusedDecoder, LoRAStep, _linear, _merge, _weight
from paged_core.runner.fused.gemma_family import GELU_APPROXIMATE, gemma_refusal, rope_types
from paged_core.runner.packed_linear import route_pack


def gemma_weight(norm: Any) -> torch.Tensor:
    """A Gemma RMSNorm's effective weight ``1 + w`` in fp32 (the backend's norm multiplies in fp32)."""
    weight: torch.Tensor = (1.0 + norm.weight.detach().float()).contiguous()
    return weight


def _cos_sin(rotary: Any, max_positions: int, device: torch.device, kind: str) -> torch.Tensor:
    """``[max_positions, D]`` cos then sin halves from the model's rotary (per layer type for Gemma3)."""
    positions = torch.arange(max_positions, device=device)[None]
    probe = torch.empty(1, dtype=torch.float32, device=device)
    cos, sin = rotary(probe, positions, kind) if kind else rotary(probe, positions)
    half = cos.shape[-1] // 2
    return torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1).float().contiguous()


@dataclass
class GemmaLayer:
    """One Gemma decoder layer in the fused layout (norm weights are ``1 + w`` in fp32)."""

    in_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    pre_ff_norm: torch.Tensor
    post_ff_norm: torch.Tensor
    eps: float
    qkv: PackedLinear | list[PackedLinear]
    o: PackedLinear
    gate_up: PackedLinear | list[PackedLinear]
    down: PackedLinear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qk_eps: float
    cos_sin: torch.Tensor
    """This layer's rotary table (Gemma3: its layer type's)."""
    index: int
    moe: None = None


class GemmaDecoder(FusedDecoder):
    """The fused decoder for Gemma2/Gemma3: :class:`FusedDecoder`'s pieces over Gemma layers.

    ``first``, ``between``, ``last`` and ``logits`` keep the base class's signatures and row-wise contract,
    so the executors (eager, compiled pieces, piecewise capture) run it as they run the base decoder.
    """

    def __init__(
        self,
        model: Any,
        backend: AttentionBackend,
        specs: list[AttentionSpec],
        max_positions: int,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        reason = gemma_refusal(model)
        if reason is not None:
            raise UnsupportedConfigError(f"the fused decoder cannot run this model: {reason}")
        self._bind(backend, specs, reduce)
        inner, config = model.model, model.config
        self.embed = inner.embed_tokens.weight.detach()
        scale = getattr(inner.embed_tokens, "embed_scale", None)
        normalizer = scale if isinstance(scale, torch.Tensor) else torch.tensor(float(config.hidden_size) ** 0.5)
        self.normalizer = normalizer.to(device=self.embed.device, dtype=self.embed.dtype)
        """``sqrt(hidden)`` rounded to the model dtype, as transformers scales the embedding."""
        self.norm = gemma_weight(inner.norm)
        self.norm_eps = float(inner.norm.eps)
        self.lm_head = route_pack(self.ops, _weight(model.lm_head), getattr(model.lm_head, "bias", None))
        cap = getattr(config, "final_logit_softcapping", None)
        self.final_soft_cap = float(cap) if cap else None
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
        self.gelu_approximate = GELU_APPROXIMATE[str(act)]
        device = self.embed.device
        kinds = rope_types(model)
        tables = {kind: _cos_sin(inner.rotary_emb, max_positions, device, kind) for kind in kinds}
        types = getattr(config, "layer_types", None)
        self.gemma_layers = [
            self._gemma_layer(i, layer, tables[types[i] if "" not in tables and types else ""])
            for i, layer in enumerate(inner.layers)
        ]
        # The base class's loops (forward, the executors' pieces) read ``layers``: the same list.
        self.layers = self.gemma_layers  # type: ignore[assignment]
        self.cos_sin = self.gemma_layers[0].cos_sin
        self._routing = None
        self.shared: dict[str, Any] = {}
        self.lora: LoRAStep | None = None

    def _gemma_layer(self, index: int, layer: Any, cos_sin: torch.Tensor) -> GemmaLayer:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        return GemmaLayer(
            in_norm=gemma_weight(layer.input_layernorm),
            post_attn_norm=gemma_weight(layer.post_attention_layernorm),
            pre_ff_norm=gemma_weight(layer.pre_feedforward_layernorm),
            post_ff_norm=gemma_weight(layer.post_feedforward_layernorm),
            eps=float(layer.input_layernorm.eps),
            qkv=_merge(self.ops, [attn.q_proj, attn.k_proj, attn.v_proj]),
            o=route_pack(self.ops, _weight(attn.o_proj), None),
            gate_up=_merge(self.ops, [mlp.gate_proj, mlp.up_proj]),
            down=route_pack(self.ops, _weight(mlp.down_proj), None),
            q_norm=gemma_weight(q_norm) if q_norm is not None else None,
            k_norm=gemma_weight(k_norm) if k_norm is not None else None,
            qk_eps=float(q_norm.eps) if q_norm is not None else 0.0,
            cos_sin=cos_sin,
            index=index,
        )

    def first(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Scaled embedding and layer 0 up to its attention: ``(q, k, v, residual)``."""
        hidden = torch.nn.functional.embedding(input_ids, self.embed) * self.normalizer
        layer = self.gemma_layers[0]
        x = self.ops.rms_norm(hidden, layer.in_norm, layer.eps)
        return (*self._gemma_qkv(layer, self.specs[0], x, positions), hidden)

    def between(  # type: ignore[override]
        self,
        done: GemmaLayer,
        layer: GemmaLayer,
        spec: AttentionSpec,
        attn: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Layer ``done`` after its attention, then ``layer`` up to its attention: ``(q, k, v, residual)``."""
        hidden, residual = self._gemma_finish(done, attn, residual)
        x, residual = self.ops.add_rms_norm(hidden, residual, layer.in_norm, layer.eps)
        return (*self._gemma_qkv(layer, spec, x, positions), residual)

    def last(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer after its attention: ``(hidden, residual)`` (``hidden`` is still to be added)."""
        return self._gemma_finish(self.gemma_layers[-1], attn, residual)

    def logits(self, hidden: torch.Tensor, residual: torch.Tensor, logits_indices: torch.Tensor | None) -> torch.Tensor:
        """The final norm, the LM head and Gemma2's final soft cap over the rows at ``logits_indices``."""
        logits = super().logits(hidden, residual, logits_indices)
        cap = self.final_soft_cap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _gemma_qkv(
        self, layer: GemmaLayer, spec: AttentionSpec, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ops = self.ops
        tokens = x.shape[0]
        q_size, kv_size = spec.num_heads * spec.head_size, spec.num_kv_heads * spec.head_size
        qkv = self._adapt(layer, "qkv", x, _linear(ops, x, layer.qkv))  # type: ignore[arg-type]
        q = qkv[:, :q_size].view(tokens, spec.num_heads, spec.head_size)
        k = qkv[:, q_size : q_size + kv_size].view(tokens, spec.num_kv_heads, spec.head_size)
        v = qkv[:, q_size + kv_size :].view(tokens, spec.num_kv_heads, spec.head_size)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = ops.rms_norm(q.reshape(-1, spec.head_size), layer.q_norm, layer.qk_eps).view_as(q)
            k = ops.rms_norm(k.reshape(-1, spec.head_size), layer.k_norm, layer.qk_eps).view_as(k)
        q, k = ops.rotary(positions, q, k, layer.cos_sin)
        return q, k, v

    def _gemma_finish(
        self, layer: GemmaLayer, attn: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer`` after attention: output projection and its norm, residual add, the normed MLP.

        Returns ``(mlp output, residual)``: the MLP output's residual add is fused into the next norm.
        """
        ops, reduce = self.ops, self.reduce
        flat = attn.reshape(attn.shape[0], -1)
        hidden = self._adapt(layer, "o", flat, ops.linear(flat, layer.o))  # type: ignore[arg-type]
        if reduce is not None:
            hidden = reduce(hidden)
        hidden = ops.rms_norm(hidden, layer.post_attn_norm, layer.eps)
        x, residual = ops.add_rms_norm(hidden, residual, layer.pre_ff_norm, layer.eps)
        gate_up = self._adapt(layer, "gate_up", x, _linear(ops, x, layer.gate_up))  # type: ignore[arg-type]
        gate, up = gate_up.chunk(2, dim=-1)
        act = torch.nn.functional.gelu(gate, approximate=self.gelu_approximate) * up
        hidden = self._adapt(layer, "down", act, ops.linear(act, layer.down))  # type: ignore[arg-type]
        if reduce is not None:
            hidden = reduce(hidden)
        return ops.rms_norm(hidden, layer.post_ff_norm, layer.eps), residual
