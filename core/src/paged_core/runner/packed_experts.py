"""A MoE layer's experts kept packed: the drop-in for transformers' ``*Experts`` module that a GGUF loads into.

A GGUF MoE file stores each layer's experts as 3-D tensors of packed blocks (``ffn_gate_exps``, ``ffn_up_exps``,
``ffn_down_exps``). Loading them packed (:mod:`paged_core.loading.gguf_experts`) puts a
:class:`PackedExpertsModule` where transformers' experts module was: it holds the layer's
:class:`~paged_core.contract.moe.PackedExperts` (stacked packed rows, no dequantized copy), which the fused
decoder hands to the backend's ``moe`` (:mod:`paged_core.runner.fused.moe_layer`), and its forward takes the
router's ``top_k_index`` and ``top_k_weights`` as transformers' modules do, so the transformers path and
``generate`` work on it too: inside an engine step through the backend's ``experts`` (packed for it once,
:meth:`PackedExpertsModule.bind`), outside one with the contract's arithmetic
(:func:`~paged_core.contract.moe.apply_experts`).
"""

from __future__ import annotations

from typing import Any

import torch

from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.moe import ExpertWeight, PackedExperts, apply_experts
from paged_core.errors import UnsupportedConfigError
from paged_core.quant import QuantizedWeight
from paged_core.runner.experts import experts_activation, pack_experts_for, step_ops


class PackedExpertsModule(torch.nn.Module):
    """Experts ``gate_up`` ``(E * 2I, H)`` / ``down`` ``(E * H, I)`` packed rows (or dense ``[E, 2I, H]`` /
    ``[E, H, I]`` where a tensor of the file has no packed format), with transformers' experts-module forward.

    ``act_fn`` is the replaced module's activation (SiLU or tanh GELU, else
    :class:`~paged_core.errors.UnsupportedConfigError` naming ``name``). The weights are not parameters:
    :meth:`to_device` moves them.
    """

    def __init__(self, gate_up: ExpertWeight, down: ExpertWeight, act_fn: torch.nn.Module, name: str = "experts"):
        super().__init__()
        self.name = name
        self.act_fn = act_fn
        activation = experts_activation(self)
        if activation is None:
            raise UnsupportedConfigError(f"{name}: activation {type(act_fn).__name__} (needs SiLU or tanh GELU)")
        self.activation = activation
        self.weights = PackedExperts(gate_up, down)
        self.num_experts = self.weights.num_experts
        self.hidden_dim = self.weights.hidden_size
        self.intermediate_dim = self.weights.intermediate_size
        self.bound: tuple[FusedOps, PackedExperts] | None = None
        """The backend's ops and the experts they packed (:meth:`bind`): what an engine step runs."""

    def bind(self, ops: FusedOps) -> None:
        """Pack the experts for ``ops`` (at load: a backend's packing may copy or interleave rows)."""
        self.bound = (ops, pack_experts_for(ops, self.weights.gate_up, self.weights.down))

    def to_device(self, device: torch.device) -> None:
        """Move the expert weights (not parameters, so ``Module.to`` leaves them)."""
        gate_up, down = self.weights.gate_up, self.weights.down
        if gate_up.device != device or down.device != device:
            self.weights = PackedExperts(gate_up.to(device), down.to(device))
            self.bound = None

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        k = top_k_index.shape[-1]
        weights, ids = top_k_weights.reshape(x.shape[0], k), top_k_index.reshape(x.shape[0], k)
        ops = step_ops()
        if ops is not None and self.bound is not None and self.bound[0] is ops:
            out = ops.experts(x, weights, ids, self.bound[1], self.activation)
        else:
            out = apply_experts(x, weights, ids, self.weights, self.activation)
        return out.view_as(hidden_states)

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, hidden={self.hidden_dim}, intermediate={self.intermediate_dim}, " + (
            "kinds={}/{}".format(*self.weights.kinds)
        )


def expert_weights(module: Any) -> tuple[ExpertWeight, ExpertWeight]:
    """An experts module's ``(gate_up, down)``: a :class:`PackedExpertsModule`'s as it holds them, transformers'
    3-D parameters otherwise (detached views)."""
    if isinstance(module, PackedExpertsModule):
        return module.weights.gate_up, module.weights.down
    return module.gate_up_proj.detach(), module.down_proj.detach()


def packed_experts_modules(model: torch.nn.Module) -> list[tuple[str, PackedExpertsModule]]:
    """Every :class:`PackedExpertsModule` of ``model``, by qualified name."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, PackedExpertsModule)]


def packed_expert_bytes(module: PackedExpertsModule) -> int:
    """Bytes the module's expert weights hold (packed rows, or a dense tensor's elements)."""
    total = 0
    for w in (module.weights.gate_up, module.weights.down):
        total += w.nbytes if isinstance(w, QuantizedWeight) else w.numel() * w.element_size()
    return total
