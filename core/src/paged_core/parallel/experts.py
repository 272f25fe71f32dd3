"""Expert parallelism: each MoE layer's routed experts spread over the tensor-parallel ranks.

With ``enable_expert_parallel`` and ``tensor_parallel_size`` N, rank ``r`` keeps experts
``[r*E/N, (r+1)*E/N)`` of every MoE layer (:func:`shard_experts`, at load: the other experts' weights
are dropped); attention and dense MLPs stay tensor-parallel as before. The expert-parallel group is
the tensor-parallel group.

**Dispatch and combine.** Under tensor parallelism every rank already holds every token's hidden state
(the attention output is all-reduced before the MoE layer's norm), so no token needs sending: each rank
routes all its tokens with the full router (the same logits on every rank, so the same choices), computes
the contributions of the slots whose expert it holds, and the partial outputs are summed over the ranks
with one all-reduce. That all-reduce is the degenerate form of the all-to-all dispatch/combine for
replicated activations: a dispatch would send each rank tokens it already has, and the combine's
per-token sum over the ranks holding the token's experts is exactly a sum over all ranks of partials that
are zero where a rank holds none of them. Splitting the tokens across ranks (a real all-to-all) would only
pay where attention is data-parallel, which this engine does not do.

**Arithmetic.** :func:`expert_parallel_moe` runs the contract's reference experts arithmetic
(:func:`~paged_core.contract.moe.apply_experts`: tokens grouped by expert, each expert's product in
float32) on the (token, slot) pairs whose expert is local, one pair per row, so each expert sees the same
rows in the same order as on one rank and produces the same bits. Each token's slots are then summed in
slot order with zeros for the slots held elsewhere, the partial sums are all-reduced in float32, and the
result is rounded once to the activations' dtype. With two slots per token (top-2: Mixtral, the tiny
Qwen3-MoE) over two ranks this is bitwise the one-rank reference (``a + 0 = a``, and a two-term sum does
not depend on its order); with more slots, the order of the float32 sum may differ in the last bit. The
backend's own ``moe`` is not used here: it takes router logits, not a partial routing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.moe import ExpertWeight, MoERouting, PackedExperts, apply_experts, route_experts
from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.tp_sizes import working_sizes
from paged_core.quant import QuantizedWeight

EXPERT_SHARD = "paged_expert_shard"
"""The attribute :func:`shard_experts` sets on each experts module: its :class:`ExpertShard`."""


@dataclass(frozen=True)
class ExpertShard:
    """Which of a layer's ``num_experts`` experts this rank holds: ``[start, stop)``."""

    num_experts: int
    start: int
    stop: int

    @property
    def local(self) -> int:
        """How many experts this rank holds."""
        return self.stop - self.start


def model_experts(model_config: Any) -> int | None:
    """The number of routed experts per MoE layer a (text) config declares, ``None`` for a dense model."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def ep_sizes(num_experts: int, tp_sizes: list[int]) -> list[int]:
    """The expert-parallel sizes that work: tensor-parallel sizes the model allows that divide ``num_experts``."""
    return [n for n in tp_sizes if num_experts % n == 0]


def check_ep(ep: int, model_config: Any, specs: list[AttentionSpec]) -> None:
    """Refuse expert parallelism over ``ep`` ranks for this model before any weight loads.

    A model without routed experts is refused (the flag would do nothing, which is more likely a mistake
    than a wish); so is an ``ep`` that does not divide the experts, naming the sizes that work (those that
    divide the experts and suit tensor parallelism, :func:`~paged_core.parallel.tp_sizes.working_sizes`).
    """
    experts = model_experts(model_config)
    if experts is None:
        arch = ", ".join(getattr(model_config, "architectures", None) or [type(model_config).__name__])
        raise UnsupportedConfigError(
            f"enable_expert_parallel: {arch} has no routed experts (no MoE layers); drop the flag"
        )
    if experts % ep:
        text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        inter = getattr(text, "intermediate_size", None)
        sizes = ep_sizes(experts, working_sizes(specs, inter if isinstance(inter, int) else None))
        raise UnsupportedConfigError(
            f"enable_expert_parallel with tensor_parallel_size={ep}: {ep} ranks do not divide the model's "
            f"{experts} experts; sizes that work: {', '.join(map(str, sizes))}"
        )


def expert_range(num_experts: int, rank: int, world: int) -> ExpertShard:
    """Rank ``rank``'s contiguous share of ``num_experts`` experts over ``world`` ranks (``world`` must divide)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world}")
    if num_experts % world:
        raise UnsupportedConfigError(f"{num_experts} experts do not split over {world} ranks")
    step = num_experts // world
    return ExpertShard(num_experts, rank * step, (rank + 1) * step)


def slice_experts(weight: ExpertWeight, shard: ExpertShard) -> ExpertWeight:
    """Experts ``[shard.start, shard.stop)`` of a stacked expert weight: a view of a dense ``[E, N, K]``
    tensor's expert dimension, or those experts' rows of a packed ``(E * N, K)`` one."""
    if isinstance(weight, QuantizedWeight):
        rows = weight.out_features // shard.num_experts
        return weight.rows(shard.start * rows, shard.stop * rows)
    if weight.shape[0] != shard.num_experts:
        raise UnsupportedConfigError(f"expert weight {tuple(weight.shape)} does not hold {shard.num_experts} experts")
    return weight.narrow(0, shard.start, shard.local)


def local_experts(experts: PackedExperts, shard: ExpertShard) -> PackedExperts:
    """The :class:`PackedExperts` of this rank's experts only (views; the backend's packing is not carried)."""
    if experts.num_experts != shard.num_experts:
        raise UnsupportedConfigError(f"{experts.num_experts} experts, the shard splits {shard.num_experts}")
    return PackedExperts(slice_experts(experts.gate_up, shard), slice_experts(experts.down, shard))


def _block_experts(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """``(name, experts module)`` of each sparse MoE block of ``model``'s decoder layers."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    found = []
    for i, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "experts") and hasattr(mlp, "gate"):
            found.append((f"layers.{i}.mlp.experts", mlp.experts))
    return found


def shard_experts(model: Any, rank: int, world: int) -> dict[str, ExpertShard]:
    """Keep rank ``rank``'s experts of every MoE layer, in place; returns each experts module's shard.

    The 3-D ``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]`` become copies of this rank's
    slice (so the full tensors are freed), ``num_experts`` says the local count, and the module carries its
    :class:`ExpertShard` as :data:`EXPERT_SHARD` for the fused decoder. Refuses, naming the layer, an experts
    module without those dense tensors (packed GGUF experts) and a model with no MoE layer.
    """
    shards: dict[str, ExpertShard] = {}
    for name, experts in _block_experts(model):
        gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or gate_up.dim() != 3:
            raise UnsupportedConfigError(
                f"{name}: expert parallelism needs dense 3-D gate_up_proj/down_proj expert tensors, "
                f"{type(experts).__name__} has none"
            )
        shard = expert_range(int(gate_up.shape[0]), rank, world)
        with torch.no_grad():
            for attr, weight in (("gate_up_proj", gate_up), ("down_proj", down)):
                part = slice_experts(weight.detach(), shard)
                assert isinstance(part, torch.Tensor)
                setattr(experts, attr, torch.nn.Parameter(part.contiguous(), requires_grad=False))
        if hasattr(experts, "num_experts"):
            setattr(experts, "num_experts", shard.local)  # noqa: B010  (an int attribute, not a submodule)
        setattr(experts, EXPERT_SHARD, shard)
        shards[name] = shard
    if not shards:
        raise UnsupportedConfigError(f"enable_expert_parallel: {type(model).__name__} has no MoE layer to split")
    return shards


def expert_parallel_moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    experts: PackedExperts,
    routing: MoERouting,
    shard: ExpertShard,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """One MoE layer under expert parallelism: ``[T, H]`` in ``x.dtype``, the same on every rank.

    ``x`` ``[T, H]`` and ``router_logits`` ``[T, E]`` are every token's (the same on every rank);
    ``experts`` are this rank's (``shard.local`` of them). This rank's slots' weighted outputs, summed per
    token in slot order (zero for slots held elsewhere), are all-reduced by ``reduce`` (the group's sum;
    ``None``: one rank holding every expert) in float32, then rounded to ``x.dtype``.
    """
    if experts.num_experts != shard.local:
        raise UnsupportedConfigError(f"{experts.num_experts} local experts, the shard holds {shard.local}")
    weights, ids = route_experts(router_logits, routing)
    tokens, k = ids.shape
    local = (ids >= shard.start) & (ids < shard.stop)
    pairs = local.reshape(-1).nonzero().squeeze(1)  # (token, slot) pairs in token-then-slot order
    rows = x.float().index_select(0, pairs // k)
    out = apply_experts(
        rows,
        weights.reshape(-1, 1).index_select(0, pairs),
        (ids.reshape(-1, 1).index_select(0, pairs) - shard.start),
        experts,
        routing.activation,
    )  # one slot per row: each row is w * expert(x), in float32 (rows are float32)
    per_slot = torch.zeros(tokens * k, x.shape[1], dtype=torch.float32, device=x.device)
    per_slot.index_copy_(0, pairs, out)
    per_slot = per_slot.view(tokens, k, -1)
    acc = per_slot[:, 0]
    for j in range(1, k):
        acc = acc + per_slot[:, j]
    acc = acc.contiguous()
    if reduce is not None:
        acc = reduce(acc)
    return acc.to(x.dtype)
