"""PackedLinearModule: a model's linear layer whose weight stays packed, multiplied by the backend's kernel.

At load, every linear layer whose checkpoint weight is packed (a GGUF block
format, or int8 made at load) becomes one of these in place of
``torch.nn.Linear``, so transformers' own modules (the ``transformers`` model
path, the HF baselines) read the packed weight too. :func:`attach_ops` then
hands each one to the backend's :class:`~paged_core.contract.fused_ops.FusedOps`
through :func:`route_pack`, which keeps formats the backend does not declare on
the reference (dequantize + matmul) and says so in the log.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch

from paged_core.contract.fused_ops import FusedOps, PackedLinear
from paged_core.quant.weight import QuantizedWeight

log = logging.getLogger("paged.engine")

_REFERENCE = FusedOps()


def route_pack(ops: FusedOps, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None) -> PackedLinear:
    """``ops.pack_linear`` for a dense weight or a format ``ops`` declares; the reference's packing otherwise.

    The reference's :class:`PackedLinear` reaches the backend's ``linear``,
    which hands it to ``FusedOps.linear`` (the contract requires that).
    """
    if isinstance(weight, QuantizedWeight) and weight.format.name not in type(ops).linear_formats:
        return _REFERENCE.pack_linear(weight, bias)
    return ops.pack_linear(weight, bias)


class PackedLinearModule(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` a :class:`QuantizedWeight`; a drop-in for ``torch.nn.Linear``'s forward.

    ``qweight`` is the packed weight (shared, as a view, with a merged
    projection when the fused decoder merges it); ``packed`` is what the
    attached :class:`FusedOps` made of it (the reference's until
    :func:`attach_ops` runs).
    """

    def __init__(self, qweight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qweight = qweight
        self.in_features, self.out_features = qweight.in_features, qweight.out_features
        self.bias = torch.nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.ops: FusedOps = _REFERENCE
        self.packed = _REFERENCE.pack_linear(qweight, self.bias)

    def set_weight(self, qweight: QuantizedWeight) -> None:
        """Point at other bytes holding the same values (a view into a merged weight), and pack them again."""
        self.qweight = qweight
        self.attach(self.ops)

    def attach(self, ops: FusedOps) -> None:
        """Multiply with ``ops`` from now on (through :func:`route_pack`)."""
        self.ops = ops
        self.packed = route_pack(ops, self.qweight, self.bias)

    def to_device(self, device: torch.device) -> None:
        """Move the packed weight (not a parameter, so ``Module.to`` leaves it) and pack it again."""
        if self.qweight.device != device:
            self.qweight = self.qweight.to(device)
            self.attach(self.ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = self.ops.linear(x.reshape(-1, self.in_features), self.packed)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.qweight.format.name}"


def packed_modules(model: torch.nn.Module) -> list[tuple[str, PackedLinearModule]]:
    """Every packed linear layer of ``model``, by qualified name."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, PackedLinearModule)]


def attach_ops(model: torch.nn.Module, ops: FusedOps) -> None:
    """Route every packed linear layer of ``model`` to ``ops``, logging the formats left on the reference."""
    mods = packed_modules(model)
    for _, m in mods:
        m.attach(ops)
    fallback = Counter(m.qweight.format.name for _, m in mods if m.qweight.format.name not in type(ops).linear_formats)
    for fmt, count in sorted(fallback.items()):
        log.warning(
            "backend ops %r have no %s kernel (they declare %s): %d layer(s) run the reference "
            "(dequantize + matmul, slow)",
            ops.name,
            fmt,
            ", ".join(sorted(type(ops).linear_formats)) or "none",
            count,
        )


def replace_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """Put ``module`` at the qualified ``name`` of ``model``."""
    parent_name, _, child = name.rpartition(".")
    parent: Any = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def packed_bytes(model: torch.nn.Module) -> int:
    """Bytes of every packed weight of ``model`` (shared views counted once)."""
    storages: dict[int, int] = {}
    for _, m in packed_modules(model):
        for t in (m.qweight.data, m.qweight.scale):
            if t is not None:
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def quantize_linears(model: torch.nn.Module) -> int:
    """Replace every ``torch.nn.Linear`` of ``model`` by its int8-per-row packed form; returns how many.

    A linear whose weight is another module's too (a tied LM head) is packed
    from it while the other module keeps the dense tensor.
    """
    from paged_core.quant.quantize import quantize_int8

    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for name, linear in linears:
        bias = linear.bias.detach() if linear.bias is not None else None
        replace_module(model, name, PackedLinearModule(quantize_int8(linear.weight, name), bias))
    log.info("int8 weight-only: %d linear layers packed", len(linears))
    return len(linears)
