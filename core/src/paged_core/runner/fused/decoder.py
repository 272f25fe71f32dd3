"""FusedDecoder: a Llama-family forward over the backend's fused ops, sharing the loaded model's weights."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec, GraphSupport
from paged_core.contract.fused_ops import FusedOps, PackedLinear
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import UnsupportedConfigError
from paged_core.lora.slots import LoRASlots
from paged_core.parallel.experts import expert_parallel_moe
from paged_core.quant import QuantizedWeight
from paged_core.quant.weight import cat_rows
from paged_core.runner.fused.families import fused_refusal
from paged_core.runner.fused.gemma_family import GEMMA_FAMILIES
from paged_core.runner.fused.moe_layer import MOE_FAMILIES, MoEMLP, build_moe, family_routing, is_moe_block, moe_call
from paged_core.runner.kv_rotation import rotating
from paged_core.runner.packed_linear import PackedLinearModule, route_pack


@dataclass
class _Layer:
    """One decoder layer's weights in the fused layout."""

    in_norm: torch.Tensor
    post_norm: torch.Tensor
    eps: float
    post_eps: float
    qkv: PackedLinear | list[PackedLinear]
    o: PackedLinear
    gate_up: PackedLinear | list[PackedLinear] | None
    down: PackedLinear | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qk_eps: float
    index: int
    moe: MoEMLP | None = None
    """A MoE layer's routed experts (then ``gate_up`` and ``down`` are ``None``)."""


def _weight(module: Any) -> torch.Tensor | QuantizedWeight:
    """A linear module's weight: its packed form, or the dense tensor."""
    return module.qweight if isinstance(module, PackedLinearModule) else module.weight.detach()


def _merge(ops: FusedOps, linears: list[Any]) -> PackedLinear | list[PackedLinear]:
    """One projection for several that read the same input; the modules keep views of the merged weight.

    The transformers modules stay usable (the plain path and the baselines run
    them) without a second copy of their weights. Packed weights merge when
    they share a format; otherwise each stays its own product (a list).
    """
    weights = [_weight(m) for m in linears]
    if all(isinstance(w, QuantizedWeight) for w in weights):
        packed = [w for w in weights if isinstance(w, QuantizedWeight)]
        if len({w.format for w in packed}) == 1:
            merged = QuantizedWeight.cat(packed, name="+".join(dict.fromkeys(w.name for w in packed)))
            start = 0
            for m in linears:
                m.set_weight(merged.rows(start, start + m.out_features))
                start += m.out_features
            return route_pack(ops, merged, _merged_bias(linears))
    if any(isinstance(w, QuantizedWeight) for w in weights):
        return [route_pack(ops, _weight(m), m.bias) for m in linears]
    weight = cat_rows([m.weight.detach() for m in linears])
    bias = _merged_bias(linears)
    start = 0
    for m in linears:
        end = start + m.out_features
        m.weight = torch.nn.Parameter(weight[start:end], requires_grad=False)
        if m.bias is not None and bias is not None:
            m.bias = torch.nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return route_pack(ops, weight, bias)


def _merged_bias(linears: list[Any]) -> torch.Tensor | None:
    biases = [m.bias for m in linears]
    if all(b is None for b in biases):
        return None
    if all(b is not None for b in biases):
        return cat_rows([b.detach() for b in biases if b is not None])
    return torch.cat(
        [
            b.detach() if b is not None else torch.zeros(m.out_features, dtype=_dtype_of(linears))
            for b, m in zip(biases, linears, strict=True)
        ]
    )


def _dtype_of(linears: list[Any]) -> torch.dtype:
    dtype: torch.dtype = next(m.bias.dtype for m in linears if m.bias is not None)
    return dtype


def _linear(ops: FusedOps, x: torch.Tensor, packed: PackedLinear | list[PackedLinear]) -> torch.Tensor:
    """A projection, or the concatenation of projections that could not merge."""
    if isinstance(packed, list):
        return torch.cat([ops.linear(x, p) for p in packed], dim=-1)
    return ops.linear(x, packed)


def _cos_sin_cache(rotary: Any, max_positions: int, device: torch.device) -> torch.Tensor:
    """``[max_positions, D]``: cos then sin halves, computed by the model's own rotary module (fp32)."""
    positions = torch.arange(max_positions, device=device)[None]
    probe = torch.empty(1, dtype=torch.float32, device=device)
    cos, sin = rotary(probe, positions)
    half = cos.shape[-1] // 2
    return torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1).float().contiguous()


@functools.cache
def _expert_parallel_moe() -> Callable[..., torch.Tensor]:
    """:func:`expert_parallel_moe` kept out of tracing (it reads the per-rank counts on the host). Wrapped on
    first use: ``torch.compiler.disable`` imports dynamo, and with it triton, which must not happen at import
    (a Triton backend decides its interpreter mode before anything imports triton)."""
    disabled: Callable[..., torch.Tensor] = torch.compiler.disable(expert_parallel_moe)  # type: ignore[no-untyped-call]
    return disabled


class FusedDecoder:
    """Runs a Llama/Mistral/Qwen2/Qwen3 model with merged projections and fused norm, activation and rotary
    (and Mixtral/Qwen3-MoE, whose MoE layers route their MLP through the backend's ``moe``).

    Built once at load from the transformers model (which keeps working: its
    q/k/v and gate/up weights become views of the merged ones). The kernels
    come from ``backend.fused_ops()``; attention is the backend's paged
    attention, as on the transformers path. It is the ``fused`` model path
    (:class:`~paged_core.runner.forward.ModelForward`).
    """

    name = "fused"

    def __init__(
        self,
        model: Any,
        backend: AttentionBackend,
        specs: list[AttentionSpec],
        max_positions: int,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        reason = fused_refusal(model)
        if reason is None and type(model).__name__ in GEMMA_FAMILIES:
            reason = "Gemma layers run on GemmaDecoder (paged_core.runner.fused.make_decoder chooses)"
        if reason is not None:
            raise UnsupportedConfigError(f"the fused decoder cannot run this model: {reason}")
        self._bind(backend, specs, reduce)
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.norm_eps = float(inner.norm.variance_epsilon)
        self.lm_head = route_pack(self.ops, _weight(model.lm_head), getattr(model.lm_head, "bias", None))
        device = self.embed.device
        self.cos_sin = _cos_sin_cache(inner.rotary_emb, max_positions, device)
        self._routing = family_routing(model) if type(model).__name__ in MOE_FAMILIES else None
        self._moe = moe_call(self.ops)
        self.layers = [self._layer(i, layer) for i, layer in enumerate(inner.layers)]
        self.shared: dict[str, Any] = {}
        """What engines running this decoder share, e.g. the compiled step (see the executors)."""
        self.lora: LoRAStep | None = None
        """The step's adapters (set by the runner before each forward; ``None``: the base model alone)."""

    def _bind(
        self,
        backend: AttentionBackend,
        specs: list[AttentionSpec],
        reduce: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> None:
        """What every fused decoder holds of its backend: the ops, the layer specs, the tensor-parallel reduce
        and the attention call."""
        self.backend = backend
        self.ops = backend.fused_ops()
        self.specs = specs
        self.reduce = reduce
        """Tensor parallel: the all-reduce of the o and down projections' partial sums (``None``: one rank)."""
        # A backend that declares no graph capture may read metadata on the host (the reference loops over
        # rows with tolist()), so torch.compile must never trace its attention: it is always called through
        # torch.compiler.disable (about 2 us a layer when eager). Under compile that is a graph break inside
        # the layer loop, so dynamo runs this forward eagerly and compiles the layer ops it calls as pieces
        # of their own, each shared by every layer. Choosing the wrapper by torch.compiler.is_compiling() was
        # a bug: in that eagerly run frame it is False, so dynamo compiled the backend's row loop frame by
        # frame, once per token count and row value (the tiny Mistral's compiled battery took 17 minutes).
        capturable = type(backend).capabilities().graph_support != GraphSupport.NEVER
        # Quantized caches hold rotated keys and values (runner/kv_rotation.py): the rotation goes with the call.
        attend = rotating(backend.forward, self.ops)
        self._attend = attend if capturable else torch.compiler.disable(attend)  # type: ignore[no-untyped-call]

    def _layer(self, index: int, layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        moe = build_moe(self.ops, self._routing, mlp) if self._routing is not None and is_moe_block(mlp) else None
        return _Layer(
            in_norm=layer.input_layernorm.weight.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            eps=float(layer.input_layernorm.variance_epsilon),
            post_eps=float(layer.post_attention_layernorm.variance_epsilon),
            qkv=_merge(self.ops, [attn.q_proj, attn.k_proj, attn.v_proj]),
            o=route_pack(self.ops, _weight(attn.o_proj), None),
            gate_up=_merge(self.ops, [mlp.gate_proj, mlp.up_proj]) if moe is None else None,
            down=route_pack(self.ops, _weight(mlp.down_proj), None) if moe is None else None,
            q_norm=q_norm.weight.detach() if q_norm is not None else None,
            k_norm=k_norm.weight.detach() if k_norm is not None else None,
            qk_eps=float(q_norm.variance_epsilon) if q_norm is not None else 0.0,
            index=index,
            moe=moe,
        )

    def forward(
        self,
        metadata: AttentionMetadata,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        logits_indices: torch.Tensor | None = None,
        layer_metadata: Sequence[AttentionMetadata] | None = None,
    ) -> torch.Tensor:
        """Logits ``[K, V]`` of the tokens at ``logits_indices`` (every token when ``None``).

        The step is its pieces in turn (see :meth:`first`): piecewise capture runs the same pieces,
        captured or compiled, with the same eager attention between them. ``layer_metadata[i]`` is layer
        ``i``'s metadata when the model has several KV-cache groups.
        """
        q, k, v, residual = self.first(input_ids, positions)
        last = len(self.layers) - 1
        meta = layer_metadata or [metadata] * len(self.layers)
        for i in range(last):
            # The backend is called here, not through attend(): under a whole-step compile this frame runs
            # eagerly and dynamo compiles the frames it calls, an attend(i) frame once per layer index.
            attn = self._attend(q, k, v, kv_caches[i], meta[i], self.specs[i])
            q, k, v, residual = self.between(
                self.layers[i], self.layers[i + 1], self.specs[i + 1], attn, residual, positions
            )
        hidden, residual = self.last(self._attend(q, k, v, kv_caches[last], meta[last], self.specs[last]), residual)
        return self.logits(hidden, residual, logits_indices)

    # The pieces of a step, split at the attention calls. Each is row-wise (a token's output reads only its own
    # row), so a piece run on a batch padded to a capture size gives its real rows what the unpadded batch would.

    def first(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Embedding and layer 0 up to its attention: ``(q, k, v, residual)``."""
        hidden = torch.nn.functional.embedding(input_ids, self.embed)
        layer = self.layers[0]
        x = self.ops.rms_norm(hidden, layer.in_norm, layer.eps)
        return (*self._qkv(layer, self.specs[0], x, positions), hidden)

    def between(
        self,
        done: _Layer,
        layer: _Layer,
        spec: AttentionSpec,
        attn: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Layer ``done`` after its attention output ``attn`` ``[T, heads, head_size]``, then ``layer`` (of
        ``spec``) up to its attention: ``(q, k, v, residual)``.

        The layers are arguments (not indices) so one compiled piece serves every pair: a compiler guards on
        their shapes, not on which layer it is.
        """
        hidden, residual = self._finish(done, attn, residual)
        x, residual = self.ops.add_rms_norm(hidden, residual, layer.in_norm, layer.eps)
        return (*self._qkv(layer, spec, x, positions), residual)

    def last(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer after its attention: ``(hidden, residual)``."""
        return self._finish(self.layers[-1], attn, residual)

    def logits(self, hidden: torch.Tensor, residual: torch.Tensor, logits_indices: torch.Tensor | None) -> torch.Tensor:
        """The final norm and the LM head over the rows at ``logits_indices`` (every row when ``None``)."""
        if logits_indices is not None:
            hidden, residual = hidden.index_select(0, logits_indices), residual.index_select(0, logits_indices)
        final, _ = self.ops.add_rms_norm(hidden, residual, self.norm, self.norm_eps)
        return self.ops.linear(final, self.lm_head)

    def attend(
        self,
        i: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Layer ``i``'s paged attention through the backend (never traced when the backend captures nothing)."""
        return self._attend(q, k, v, kv_cache, metadata, self.specs[i])

    def _qkv(
        self, layer: _Layer, spec: AttentionSpec, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ops = self.ops
        tokens = x.shape[0]
        q_size, kv_size = spec.num_heads * spec.head_size, spec.num_kv_heads * spec.head_size
        qkv = self._adapt(layer, "qkv", x, _linear(ops, x, layer.qkv))
        q = qkv[:, :q_size].view(tokens, spec.num_heads, spec.head_size)
        k = qkv[:, q_size : q_size + kv_size].view(tokens, spec.num_kv_heads, spec.head_size)
        v = qkv[:, q_size + kv_size :].view(tokens, spec.num_kv_heads, spec.head_size)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = ops.rms_norm(q.reshape(-1, spec.head_size), layer.q_norm, layer.qk_eps).view_as(q)
            k = ops.rms_norm(k.reshape(-1, spec.head_size), layer.k_norm, layer.qk_eps).view_as(k)
        q, k = ops.rotary(positions, q, k, self.cos_sin)
        return q, k, v

    def _finish(self, layer: _Layer, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer`` after attention: output projection, post-attention norm and MLP."""
        ops, reduce = self.ops, self.reduce
        flat = attn.reshape(attn.shape[0], -1)
        hidden = self._adapt(layer, "o", flat, ops.linear(flat, layer.o))
        if reduce is not None:
            hidden = reduce(hidden)
        x, residual = ops.add_rms_norm(hidden, residual, layer.post_norm, layer.post_eps)
        if layer.moe is not None:
            moe = layer.moe
            if moe.shard is not None:  # expert parallel: tokens to their experts' ranks and back, by all-to-all
                logits = ops.linear(x, moe.router)
                return _expert_parallel_moe()(x, logits, moe.experts, moe.routing, moe.shard, ops), residual
            # Every rank holds every expert (tensor parallelism splits Linear modules only): the output is whole,
            # not a partial sum to reduce. Adapters have no expert projections to target.
            return self._moe(x, ops.linear(x, moe.router), moe.experts, moe.routing), residual
        assert layer.gate_up is not None and layer.down is not None
        act = ops.silu_and_mul(self._adapt(layer, "gate_up", x, _linear(ops, x, layer.gate_up)))
        hidden = self._adapt(layer, "down", act, ops.linear(act, layer.down))
        if reduce is not None:
            hidden = reduce(hidden)
        return hidden, residual

    def _adapt(self, layer: _Layer, group: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the projection of ``x``) plus each token's adapter, when the step has any."""
        lora = self.lora
        if lora is None:
            return y
        stacked = lora.slots.layers[layer.index][group]
        shrunk = self.ops.lora_shrink(x, stacked.a, lora.token_slots)
        return self.ops.lora_expand(y, shrunk, stacked.b, lora.token_slots)


@dataclass
class LoRAStep:
    """The adapters of one step: the resident slots' weights and each token's slot (``-1``: none)."""

    slots: LoRASlots
    token_slots: torch.Tensor
