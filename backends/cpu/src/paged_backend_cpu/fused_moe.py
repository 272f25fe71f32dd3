"""Routed experts for :class:`~paged_backend_cpu.fused.CpuFusedOps`: what ``pack_experts`` keeps and how ``experts``
calls the C++ op.

The routing is ``CpuFusedOps.moe``'s (:func:`route`: :func:`paged_core.api.route_experts` in one C++ op,
``paged_cpu::moe_route``, csrc/moe_route.cpp: ~4 us a call at decode where route_experts' dozen small torch ops took
~18), a model's own router (the transformers path) or expert parallelism's dispatch; ``paged_cpu::moe`` then groups
the tokens by expert and multiplies each expert's rows by the packed linear's kernels, reading only the chosen
experts' bytes (csrc/moe_ops.cpp). Expert weights are kept as they are: packed rows in place (q4_0 / q4_1 also get
the interleaved copy the int8-activation path reads, as ``pack_linear`` makes for a linear), dense ones in their
dtype, read in place by row kernels of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from paged_backend_cpu import ops
from paged_core.api import (
    Activation,
    MoERouting,
    PackedExperts,
    QuantizedWeight,
    check_experts_inputs,
    route_experts,
)

DENSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Dense expert dtypes the op reads (and compute dtypes of ``x``)."""
INTERLEAVED_FORMATS = frozenset({"q4_0", "q4_1"})
"""Formats whose experts also get rows in groups of 8 (:func:`ops.interleave_q4`), as ``CpuFusedOps.pack_linear``."""


@dataclass(frozen=True)
class CpuExperts:
    """What :meth:`CpuFusedOps.pack_experts` puts in :attr:`PackedExperts.packed`: the op's arguments per projection."""

    gate_up: ops.MoEProjection
    down: ops.MoEProjection


def _projection(
    weight: torch.Tensor | QuantizedWeight,
    rows_per_expert: int,
    formats: frozenset[str],
    stream_rows: Mapping[str, int],
    interleave: bool,
) -> ops.MoEProjection | None:
    """``weight`` as the op reads it, or ``None`` where the op does not serve it (the reference then does)."""
    if isinstance(weight, QuantizedWeight):
        name = weight.format.name
        if name not in formats or name not in ops.QUANT_FORMATS or weight.device.type != "cpu":
            return None
        fid = ops.QUANT_FORMATS[name]
        interleaved = None
        if interleave and name in INTERLEAVED_FORMATS and rows_per_expert % 8 == 0:
            interleaved = ops.interleave_q4(weight.data, fid)
        return ops.MoEProjection(weight.data, weight.scale, interleaved, fid, stream_rows.get(name, 4))
    if weight.device.type != "cpu" or weight.dtype not in DENSE_DTYPES:
        return None
    data = weight.detach()
    return ops.MoEProjection(data if data.stride(-1) == 1 else data.contiguous(), None, None, ops.MOE_DENSE, 0)


def pack(
    experts: PackedExperts, formats: frozenset[str], stream_rows: Mapping[str, int], interleave: bool
) -> CpuExperts | None:
    """The op's view of ``experts`` (checked by :class:`PackedExperts` already), or ``None`` if it cannot serve both."""
    gate_up = _projection(experts.gate_up, 2 * experts.intermediate_size, formats, stream_rows, interleave)
    down = _projection(experts.down, experts.hidden_size, formats, stream_rows, interleave)
    if gate_up is None or down is None:
        return None
    return CpuExperts(gate_up, down)


def serves(x: torch.Tensor, experts: PackedExperts) -> bool:
    """Whether :func:`moe` takes this call (experts it packed, ``x`` a cpu tensor of a dtype it reads)."""
    return isinstance(experts.packed, CpuExperts) and x.device.type == "cpu" and x.dtype in DENSE_DTYPES


def experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts, activation: Activation
) -> torch.Tensor:
    """``FusedOps.experts`` through ``paged_cpu::moe`` for experts :func:`pack` made; refuses inputs that do not fit."""
    check_experts_inputs(x, weights, ids, experts)
    packed = experts.packed
    assert isinstance(packed, CpuExperts)
    # The op reads float32 weights and int32 ids (a model's router gives its own dtypes; these copies are [T, k]).
    return ops.moe(
        x, weights.float(), ids.to(torch.int32), packed.gate_up, packed.down, ops.MOE_ACTIVATIONS[activation]
    )


def route(router_logits: torch.Tensor, routing: MoERouting) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~paged_core.api.route_experts`'s ``(weights [T, k] float32, ids [T, k] int32)``: by
    ``paged_cpu::moe_route`` for cpu logits in float32, bfloat16 or float16 (the same ids; softmax weights the same
    bits on x86-64, sigmoid ones within 4 ulps; see :func:`ops.moe_route`), by ``route_experts`` itself for others."""
    if router_logits.device.type != "cpu" or router_logits.dtype not in DENSE_DTYPES or router_logits.dim() != 2:
        return route_experts(router_logits, routing)
    return ops.moe_route(
        router_logits,
        routing.top_k,
        ops.MOE_SCORINGS[routing.scoring],
        routing.renormalize,
        float(routing.routed_scaling),
    )
