"""Fakes whose ``fused_ops().moe`` is a correct reimplementation, or broken in one known way each.

Imported by the nested suite runs as ``moe_fakes:ClassName``. Attention is
:class:`~conformance_fakes.GoodFake`'s (float32); only the routed experts differ. The reimplementation
shares nothing with the reference's grouping: a custom op that runs every expert on every token and
weights the outputs by a dense ``[T, E]`` routing matrix (what small-``E`` GPU kernels do). Each bug is one a
kernel port makes: a routing flag ignored, ``torch.topk``'s order for ties, GGUF's separate gate and up
halves read as one merged ``gate_up``, a backend's own layout assumed for experts the reference packed.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from fused_fakes import FusedFake

from paged_core.api import (
    LINEAR_FORMATS,
    Activation,
    FusedOps,
    MoERouting,
    PackedExperts,
    QuantizedWeight,
    route_experts,
)
from paged_core.testing import dequantize

ExpertWeight = torch.Tensor | QuantizedWeight


def _routing_matrix(logits: torch.Tensor, routing: MoERouting, variant: str) -> torch.Tensor:
    """``[T, E]`` float32: each token's weight for every expert (0 for the unchosen)."""
    if variant == "no_renormalize":
        routing = MoERouting(
            routing.num_experts,
            routing.top_k,
            routing.scoring,
            renormalize=False,
            activation=routing.activation,
            routed_scaling=routing.routed_scaling,
        )
    if variant == "topk":  # torch.topk of the scores: equal scores in the kernel's order, not by expert id
        z = logits.float()
        scores = z.softmax(-1) if routing.scoring == "softmax" else z.sigmoid()
        weights, ids = scores.topk(routing.top_k, dim=-1)
        if routing.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights * routing.routed_scaling
    else:
        weights, ids = route_experts(logits, routing)
    return torch.zeros(logits.shape[0], routing.num_experts).scatter_(1, ids.long(), weights)


@torch.library.custom_op("paged_conformance_fakes::moe_all_experts", mutates_args=())
def _moe_all_experts(
    x: torch.Tensor,
    logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    scoring: str,
    renormalize: bool,
    activation: str,
    routed_scaling: float,
    variant: str,
) -> torch.Tensor:
    routing = MoERouting(
        gate_up.shape[0],
        top_k,
        scoring,  # type: ignore[arg-type]
        renormalize=renormalize,
        activation=activation,  # type: ignore[arg-type]
        routed_scaling=routed_scaling,
    )
    matrix = _routing_matrix(logits, routing, variant)
    inter = down.shape[2]
    h = torch.einsum("th,eih->tei", x.float(), gate_up.float())
    gate, up = (h[..., inter:], h[..., :inter]) if variant == "swapped" else (h[..., :inter], h[..., inter:])
    act = torch.nn.functional.silu(gate) if activation == "silu" else torch.nn.functional.gelu(gate, approximate="tanh")
    y = torch.einsum("tei,ehi->teh", act * up, down.float())
    return torch.einsum("te,teh->th", matrix, y).to(x.dtype)


@_moe_all_experts.register_fake
def _(
    x: torch.Tensor,
    logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    scoring: str,
    renormalize: bool,
    activation: str,
    routed_scaling: float,
    variant: str,
) -> torch.Tensor:
    return x.new_empty(x.shape)


def all_experts(
    x: torch.Tensor,
    logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    routing: MoERouting,
    variant: str = "",
) -> torch.Tensor:
    out: torch.Tensor = torch.ops.paged_conformance_fakes.moe_all_experts(
        x,
        logits,
        gate_up,
        down,
        routing.top_k,
        routing.scoring,
        routing.renormalize,
        routing.activation,
        float(routing.routed_scaling),
        variant,
    )
    return out


class AllExpertsOps(FusedOps):
    """Correct: dense experts through the all-experts custom op; packed ones (the reference's) to ``super().moe``."""

    name = "all-experts"
    moe_formats: ClassVar[frozenset[str]] = frozenset()
    VARIANT: ClassVar[str] = ""

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        if isinstance(experts.gate_up, QuantizedWeight) or isinstance(experts.down, QuantizedWeight):
            return super().moe(x, router_logits, experts, routing)
        experts.check_routing(routing)
        return all_experts(x, router_logits, experts.gate_up, experts.down, routing, self.VARIANT)


class AllExperts(FusedFake):
    OPS = AllExpertsOps


class NoRenormalizeOps(AllExpertsOps):
    """Bug: ignores ``routing.renormalize`` (a kernel written for Qwen's routing, reused for Mixtral's)."""

    VARIANT = "no_renormalize"


class NoRenormalize(FusedFake):
    OPS = NoRenormalizeOps


class TopkTiesOps(AllExpertsOps):
    """Bug: chooses with ``torch.topk`` of the scores, so equal logits go in the kernel's order."""

    VARIANT = "topk"


class TopkTies(FusedFake):
    OPS = TopkTiesOps


class SwappedGateUpOps(AllExpertsOps):
    """Bug: ``act(up) * gate``: each expert's ``gate_up`` halves taken the other way round."""

    VARIANT = "swapped"


class SwappedGateUp(FusedFake):
    OPS = SwappedGateUpOps


class WritesXOps(AllExpertsOps):
    """Bug: uses ``x`` as scratch after reading it (a kernel reusing its input buffer)."""

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        out = super().moe(x, router_logits, experts, routing)
        x.mul_(0.5)
        return out


class WritesX(FusedFake):
    OPS = WritesXOps


class HostSyncOps(AllExpertsOps):
    """Bug for captured steps only: reads the largest logit on the host (right values, eagerly)."""

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        if float(router_logits.abs().max()) > 1e6:
            raise ValueError("logits out of range")
        return super().moe(x, router_logits, experts, routing)


class HostSync(FusedFake):
    OPS = HostSyncOps


# --- packed experts ----------------------------------------------------------------------------------------------


class OwnQ8Ops(FusedOps):
    """Packs ``q8_0`` experts itself into dense float32 ``[E, 2I, H]`` / ``[E, H, I]`` (its ``packed``), and runs them
    through the all-experts op. ``SPLIT_HALVES``: the bug of reading a ``gate_up`` of all experts' gate rows,
    then all experts' up rows (GGUF's two tensors concatenated), instead of the contract's per-expert order."""

    name = "own-q8"
    moe_formats: ClassVar[frozenset[str]] = frozenset({"q8_0"})
    SPLIT_HALVES: ClassVar[bool] = False
    TRUSTS_PACKED: ClassVar[bool] = False

    def pack_experts(self, gate_up: ExpertWeight, down: ExpertWeight) -> PackedExperts:
        experts = PackedExperts(gate_up, down)
        e, h, i = experts.num_experts, experts.hidden_size, experts.intermediate_size
        gu = dequantize(gate_up) if isinstance(gate_up, QuantizedWeight) else gate_up.float()
        if self.SPLIT_HALVES:
            gu = gu.reshape(2, e, i, h).transpose(0, 1)
        dn = dequantize(down) if isinstance(down, QuantizedWeight) else down.float()
        return PackedExperts(gate_up, down, packed=(gu.reshape(e, 2 * i, h), dn.reshape(e, h, i)))

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        if experts.packed is None and not self.TRUSTS_PACKED:
            return super().moe(x, router_logits, experts, routing)
        experts.check_routing(routing)
        gate_up, down = experts.packed  # the reference's experts have none: a TypeError for TRUSTS_PACKED
        return all_experts(x, router_logits, gate_up, down, routing)


class OwnQ8(FusedFake):
    OPS = OwnQ8Ops


class SplitHalvesOps(OwnQ8Ops):
    SPLIT_HALVES = True


class SplitHalves(FusedFake):
    OPS = SplitHalvesOps


class TrustsPackedOps(OwnQ8Ops):
    """Bug: assumes every experts object is its own (the reference-packed formats arrive with ``packed=None``)."""

    TRUSTS_PACKED = True


class TrustsPacked(FusedFake):
    OPS = TrustsPackedOps


class MisnamedOps(AllExpertsOps):
    """Declares ``"Q8_0"`` and ``"fp32"``: no name of the contract's."""

    moe_formats = frozenset({"Q8_0"})
    batch_invariant_moe = frozenset({"fp32"})


class Misnamed(FusedFake):
    OPS = MisnamedOps


# --- batch invariance --------------------------------------------------------------------------------------------


class RowByRowOps(FusedOps):
    """The reference on each token alone: invariant, and declares it for float32 and ``q8_0`` experts."""

    name = "row-by-row"
    moe_formats: ClassVar[frozenset[str]] = frozenset(LINEAR_FORMATS)
    batch_invariant_moe: ClassVar[frozenset[str]] = frozenset({"float32", "q8_0"})
    ABOVE: ClassVar[int] = 1 << 30

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        if x.shape[0] > self.ABOVE:  # the bug of VariantRows: another rounding for larger calls
            out = super().moe(x, router_logits, experts, routing)
            return (out.float() * (1 + 2.0**-20)).to(x.dtype)
        rows = [
            super(RowByRowOps, self).moe(x[t : t + 1].clone(), router_logits[t : t + 1].clone(), experts, routing)
            for t in range(x.shape[0])
        ]
        return torch.cat(rows) if rows else super().moe(x, router_logits, experts, routing)


class RowByRow(FusedFake):
    OPS = RowByRowOps


class VariantRowsOps(RowByRowOps):
    """Bug: above 4 tokens the result takes another rounding (close to right; only its bits move)."""

    ABOVE = 4


class VariantRows(FusedFake):
    OPS = VariantRowsOps


class ExpertsNormalisesOps(FusedOps):
    """Bug: ``experts`` divides each token's weights by their sum (a renormalisation folded into the kernel), right
    for routings that renormalise and wrong for a routing given as it is (Qwen3-MoE's, a scaled sigmoid's)."""

    name = "experts-normalises"

    def experts(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        experts: PackedExperts,
        activation: Activation = "silu",
    ) -> torch.Tensor:
        w = weights.float()
        return super().experts(x, w / w.sum(-1, keepdim=True), ids, experts, activation)


class ExpertsNormalises(FusedFake):
    OPS = ExpertsNormalisesOps
