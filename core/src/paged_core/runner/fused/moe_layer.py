"""The fused decoder's routed-experts MLP (Mixtral, Qwen3-MoE): the router's product, then the backend's ``moe``.

A MoE layer's MLP in transformers is a sparse block holding a router (``gate``: a ``[E, H]`` weight, no bias)
and an experts module (3-D ``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``). At load the router
becomes a packed linear and the experts one :meth:`FusedOps.pack_experts
<paged_core.contract.fused_ops.FusedOps.pack_experts>`; a step computes the router logits with ``linear`` and
hands them to :meth:`FusedOps.moe <paged_core.contract.fused_ops.FusedOps.moe>` with the family's
:class:`~paged_core.contract.moe.MoERouting`. Which blocks qualify is :func:`moe_refusal`'s to say, layer by
layer; a model with a layer it refuses runs on transformers' modules instead (``model_impl='auto'``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paged_core.contract.fused_ops import FusedOps, PackedLinear
from paged_core.contract.moe import MoERouting, PackedExperts
from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.experts import EXPERT_SHARD, ExpertShard
from paged_core.runner.experts import experts_activation, experts_refusal, pack_experts_for
from paged_core.runner.packed_experts import PackedExpertsModule, expert_weights
from paged_core.runner.packed_linear import route_pack


@dataclass(frozen=True)
class MoEFamily:
    """What a MoE family's sparse block looks like in transformers, and how it routes."""

    block: str
    """The sparse block's class name (the layer's ``mlp``)."""
    router: str
    """The router's class name (the block's ``gate``): its rule is the one :attr:`routing` states."""
    experts: str
    """The experts module's class name (the block's ``experts``)."""
    routing: Callable[[Any], tuple[int, int, bool]]
    """``(num_experts, top_k, renormalize)`` from the model's config."""


MOE_FAMILIES: dict[str, MoEFamily] = {
    # MixtralTopKRouter: softmax over all experts, top-k, divided by their sum (always).
    "MixtralForCausalLM": MoEFamily(
        "MixtralSparseMoeBlock",
        "MixtralTopKRouter",
        "MixtralExperts",
        lambda c: (int(c.num_local_experts), int(c.num_experts_per_tok), True),
    ),
    # Qwen3MoeTopKRouter: the same, divided by their sum only with norm_topk_prob. Layers listed in mlp_only_layers
    # (or off the decoder_sparse_step) have a dense Qwen3MoeMLP, which the fused decoder runs as any dense MLP.
    "Qwen3MoeForCausalLM": MoEFamily(
        "Qwen3MoeSparseMoeBlock",
        "Qwen3MoeTopKRouter",
        "Qwen3MoeExperts",
        lambda c: (int(c.num_experts), int(c.num_experts_per_tok), bool(c.norm_topk_prob)),
    ),
}
"""The MoE architectures the fused decoder runs, by transformers' class name."""


@dataclass
class MoEMLP:
    """One layer's routed experts in the fused layout."""

    router: PackedLinear
    """``[E, H]``: the router logits are ``linear(x, router)``."""
    experts: PackedExperts
    routing: MoERouting
    shard: ExpertShard | None = None
    """Expert parallel: which of the routing's experts ``experts`` holds (``None``: all of them)."""


def is_moe_block(mlp: Any) -> bool:
    """Whether a layer's ``mlp`` is a sparse MoE block (a router and experts) rather than a dense MLP."""
    return hasattr(mlp, "experts") and hasattr(mlp, "gate")


def family_routing(model: Any) -> MoERouting:
    """The :class:`MoERouting` of ``model``'s family and config (raises ``UnsupportedConfigError`` naming the field)."""
    family = MOE_FAMILIES[type(model).__name__]
    experts, top_k, renormalize = family.routing(model.config)
    return MoERouting(experts, top_k, renormalize=renormalize)


def moe_refusal(model: Any) -> str | None:
    """``None`` when every layer of a MoE-family ``model`` is a sparse block the op serves or a dense gated MLP,
    else the reason, naming the layer."""
    arch = type(model).__name__
    family = MOE_FAMILIES[arch]
    try:
        routing = family_routing(model)
    except UnsupportedConfigError as exc:
        return f"{arch}: its routing: {exc}"
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not is_moe_block(mlp):
            if not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj")):
                return f"{arch}: layer {i}'s mlp {type(mlp).__name__} is neither a sparse block nor a gated MLP"
            continue
        reason = _block_refusal(family, routing, mlp)
        if reason is not None:
            return f"{arch}: layer {i}: {reason}"
    return None


def _block_refusal(family: MoEFamily, routing: MoERouting, mlp: Any) -> str | None:
    if type(mlp).__name__ != family.block:
        return f"the sparse block is a {type(mlp).__name__}, not {family.block}"
    gate, experts = mlp.gate, mlp.experts
    if type(gate).__name__ != family.router:
        return f"router {type(gate).__name__} (the fused decoder knows {family.router}'s rule)"
    weight = getattr(gate, "weight", None)
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (routing.num_experts, weight.shape[-1]):
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
        return f"router weight {shape} (needs [{routing.num_experts}, hidden])"
    if getattr(gate, "bias", None) is not None:
        return "the router has a bias"
    if int(getattr(gate, "top_k", routing.top_k)) != routing.top_k:
        return f"the router's top_k {gate.top_k} differs from the config's num_experts_per_tok {routing.top_k}"
    packed = isinstance(experts, PackedExpertsModule)  # a GGUF's experts kept packed: the contract's layout
    if type(experts).__name__ != family.experts and not packed:
        return f"experts {type(experts).__name__}, not {family.experts}"
    reason = None if packed else experts_refusal(experts)
    if reason is not None:
        return reason
    if experts_activation(experts) != routing.activation:
        return f"experts activation {experts_activation(experts)} (the routing runs {routing.activation})"
    count, hidden = (
        (experts.num_experts, experts.hidden_dim)
        if packed
        else (int(experts.gate_up_proj.shape[0]), int(experts.gate_up_proj.shape[-1]))
    )
    shard = getattr(experts, EXPERT_SHARD, None)  # expert parallel: this rank holds a slice of the experts
    if isinstance(shard, ExpertShard) and count == shard.local:
        count = shard.num_experts
    if count != routing.num_experts:
        return f"{count} experts, the config routes over {routing.num_experts}"
    if hidden != int(weight.shape[-1]):
        return f"the router reads {int(weight.shape[-1])} features, the experts {hidden}"
    return None


def build_moe(ops: FusedOps, routing: MoERouting, mlp: Any) -> MoEMLP:
    """A sparse block (checked by :func:`moe_refusal`) in the fused layout: views of its weights (a GGUF's packed
    expert rows as they are), no copies unless the backend's packing makes them."""
    return MoEMLP(
        router=route_pack(ops, mlp.gate.weight.detach(), None),
        experts=pack_experts_for(ops, *expert_weights(mlp.experts)),
        routing=routing,
        shard=getattr(mlp.experts, EXPERT_SHARD, None),
    )


def moe_call(ops: FusedOps) -> Callable[[torch.Tensor, torch.Tensor, PackedExperts, MoERouting], torch.Tensor]:
    """``ops.moe``, kept out of ``torch.compile`` when its experts are the reference's (which reads the per-expert
    counts on the host: traced, every new set of counts would compile again). A backend's own ``experts`` (or
    ``moe``) is a custom op with a fake implementation (the contract), traced like its other ops."""
    if type(ops).moe is FusedOps.moe and type(ops).experts is FusedOps.experts:
        disabled: Callable[[torch.Tensor, torch.Tensor, PackedExperts, MoERouting], torch.Tensor]
        disabled = torch.compiler.disable(ops.moe)  # type: ignore[no-untyped-call]
        return disabled
    return ops.moe
