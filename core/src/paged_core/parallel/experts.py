"""Expert parallelism: each MoE layer's routed experts spread over the tensor-parallel ranks.

With ``enable_expert_parallel`` and ``tensor_parallel_size`` N, rank ``r`` keeps experts
``[r*E/N, (r+1)*E/N)`` of every MoE layer (:func:`shard_experts`, at load: the other experts' weights
are dropped); attention and dense MLPs stay tensor-parallel as before. The expert-parallel group is
the tensor-parallel group.

**Dispatch and combine** (:func:`expert_parallel_moe`, collectives in :mod:`paged_core.parallel.dispatch`).
Every rank enters the MoE layer holding every token (attention is tensor-parallel), but each takes only its
contiguous share of the step's tokens (:func:`~paged_core.parallel.dispatch.token_slice`) and routes them.
Its (token, slot) pairs, sorted by expert, go to the ranks holding those experts by one ``all_to_all_single``
(after one of the per-expert counts); each rank runs what it received through the backend's
:meth:`FusedOps.experts <paged_core.contract.fused_ops.FusedOps.experts>` (one slot per row, weight 1,
float32 rows: the per-pair output is the expert's float32 product); a second all-to-all brings the products
back, each rank sums its tokens' ``k`` products times their weights in slot order in float32 and rounds
once, and an all-gather gives every rank the whole ``[T, H]``.

**Arithmetic.** Source ranks hold ascending token ranges, so the rows an expert receives, concatenated by
source rank, are in the step's token order: each expert sees the rows one rank would give it, in the same
order, and the combine is the one-rank arithmetic (:func:`~paged_core.contract.moe.apply_experts`'s), so
with the reference experts the result is one rank's bit for bit, for any ``top_k`` and dtype. A backend's
kernel gives one rank's bits where a row's product depends neither on the rows beside it nor on the other
slots of the call, and float32 rows are computed as the activations' dtype would be (the cpu backend in
float32 models: tests/parallel/test_ep_parity.py).

**Volume**, per layer and step (``T`` tokens, ``H`` features, top-``k``, ``N`` ranks, experts chosen evenly):
each rank sends ``k T (N-1) / N^2`` rows in the activations' dtype, the same number of float32 products back,
``T (N-1) / N`` rows in the activations' dtype by the all-gather, and ``E`` counts. The all-reduce of float32
partials this replaced (every rank computing its experts' share of every token) sent ``2 T (N-1) / N`` float32
rows per rank. Measured with ``N = 2``, top-2, ``T = 64``, ``H = 4096``: 1.54 MB per rank in float32 and 1.04
MB in bf16, against 1.05 MB for the all-reduce. With attention tensor-parallel the exchange buys no bytes at
two ranks; it keeps each rank's expert work to the pairs its experts were sent, and is the form a data-parallel
attention needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.moe import ExpertWeight, MoERouting, PackedExperts, route_experts
from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.dispatch import all_gather_rows, all_to_all, token_slice
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
    ops: FusedOps,
) -> torch.Tensor:
    """One MoE layer under expert parallelism: ``[T, H]`` in ``x.dtype``, the same on every rank.

    ``x`` ``[T, H]`` and ``router_logits`` ``[T, E]`` are every token's (the same on every rank);
    ``experts`` are this rank's (``shard.local`` of them), computed by ``ops.experts``. The ranks are the
    default ``torch.distributed`` group's, which must be the shard's (rank ``shard.start // shard.local`` of
    ``E // shard.local``); one rank holding every expert calls ``ops.experts`` on its routing, no collective.
    Reads the per-rank row counts on the host (eager only).
    """
    if experts.num_experts != shard.local:
        raise UnsupportedConfigError(f"{experts.num_experts} local experts, the shard holds {shard.local}")
    world, rank = shard.num_experts // shard.local, shard.start // shard.local
    if world == 1:
        weights, ids = route_experts(router_logits, routing)
        return ops.experts(x, weights, ids, experts, routing.activation)
    _check_group(rank, world)
    tokens, hidden = x.shape
    mine = token_slice(tokens, rank, world)
    weights, ids = route_experts(router_logits[mine], routing)
    k = ids.shape[1]
    flat = ids.reshape(-1).long()
    # The pairs by expert (stable: token then slot within one): by destination rank, then local expert.
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=shard.num_experts)
    received = all_to_all(counts, None, None)  # [N * local]: each source's pairs per local expert
    send_splits = counts.view(world, shard.local).sum(1).tolist()
    recv_splits = received.view(world, shard.local).sum(1).tolist()
    rows = all_to_all(x[mine].index_select(0, order // k), send_splits, recv_splits)
    products = _local_products(ops, rows, received, experts, routing, hidden)
    back = all_to_all(products, recv_splits, send_splits)
    per_pair = torch.empty_like(back)
    per_pair.index_copy_(0, order, back)
    out = _combine(per_pair.view(-1, k, hidden), weights)
    return all_gather_rows(out.to(x.dtype), tokens, rank, world)


def _check_group(rank: int, world: int) -> None:
    import torch.distributed as dist

    if not dist.is_initialized() or (dist.get_rank(), dist.get_world_size()) != (rank, world):
        group = f"rank {dist.get_rank()} of {dist.get_world_size()}" if dist.is_initialized() else "no group"
        raise UnsupportedConfigError(f"expert shard of rank {rank} of {world}, but this process is {group}")


def _local_products(
    ops: FusedOps,
    rows: torch.Tensor,
    received: torch.Tensor,
    experts: PackedExperts,
    routing: MoERouting,
    hidden: int,
) -> torch.Tensor:
    """``[R, H]`` float32: each received row's expert product (rows by source rank, each source's by local expert)."""
    if rows.shape[0] == 0:
        return torch.empty(0, hidden, dtype=torch.float32, device=rows.device)
    local = torch.arange(experts.num_experts, device=rows.device).repeat(received.shape[0] // experts.num_experts)
    ids = local.repeat_interleave(received).to(torch.int32).unsqueeze(1)
    ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
    return ops.experts(rows.float(), ones, ids, experts, routing.activation)


def _combine(per_slot: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[T, H]`` float32: each token's ``k`` products times their weights, summed in slot order (as one rank)."""
    w = weights.float()
    acc = per_slot[:, 0] * w[:, 0:1]
    for j in range(1, per_slot.shape[1]):
        acc = acc + per_slot[:, j] * w[:, j : j + 1]
    return acc
