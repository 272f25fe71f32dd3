"""TritonFusedOps: the reference's layer ops with the multi-LoRA pair and routed experts as Triton kernels.

:class:`~paged_triton.backend.TritonBackend` returns it from ``fused_ops()``, so every Triton backend (ROCm, XPU)
runs ``lora_shrink`` / ``lora_expand`` through :mod:`paged_triton.lora_kernels` (custom ops
``paged_triton::lora_shrink`` / ``paged_triton::lora_expand``) and ``experts`` over dense weights through
:mod:`paged_triton.moe_kernels` (custom op ``paged_triton::moe_experts``; ``moe`` is the base's: route, then
``experts``), all capturable (no host reads), and inherits the reference for the rest. Importing this module
does not import triton; the first call does.
"""

from __future__ import annotations

import torch

from paged_core.api import Activation, FusedOps, PackedExperts

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
MOE_ACTIVATIONS = frozenset({"silu", "gelu_tanh"})
"""The gated activations the experts kernels compute (others go to the reference)."""


class TritonFusedOps(FusedOps):
    """:class:`FusedOps` with ``lora_shrink`` and ``lora_expand`` launched as Triton kernels (other dtypes, or a
    ``slots`` tensor on another device than the activations, go to the reference)."""

    name = "triton"
    moe_formats = frozenset()
    """No packed expert format is served here: packed experts go to the reference (``super().experts``)."""
    batch_invariant_moe = frozenset({"float32", "bfloat16", "float16"})
    """Dense experts: the kernels' tiles are fixed by the layer's sizes, never by the token count, so each output
    is its own row times one column reduced in the same ``BLOCK_K`` steps wherever its pair lands in a block,
    and the weighted sum is elementwise. Checked bit for bit in the interpreter (``interp_moe.py``, and the
    conformance suite's batch-invariance section), not yet on a GPU."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """``[T, R]`` fp32, row ``t`` = ``x[t] @ a[slots[t]].T``, zero where ``slots[t] < 0``."""
        if x.dtype not in DTYPES or a.dtype not in DTYPES or slots.device != x.device:
            return super().lora_shrink(x, a, slots)
        from paged_triton import ops

        out: torch.Tensor = ops.lora_shrink(x, a, slots)
        return out

    def lora_expand(self, y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """In place ``y[t] += shrunk[t] @ b[slots[t]].T`` (fp32 sums, one rounding); returns ``y``."""
        if y.dtype not in DTYPES or b.dtype not in DTYPES or slots.device != y.device:
            return super().lora_expand(y, shrunk, b, slots)
        from paged_triton import ops

        ops.lora_expand(y, shrunk, b, slots)
        return y

    def experts(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        experts: PackedExperts,
        activation: Activation = "silu",
    ) -> torch.Tensor:
        """Routed experts for a given routing (``[T, H]`` in ``x.dtype``): dense fp32/bf16/fp16 experts on ``x``'s
        device run the Triton grouped GEMM; packed experts, other dtypes or devices, and inputs whose shapes
        do not fit (refused there) go to the reference."""
        gate_up, down = experts.gate_up, experts.down
        if not (
            isinstance(gate_up, torch.Tensor)
            and isinstance(down, torch.Tensor)
            and activation in MOE_ACTIVATIONS
            and {x.dtype, gate_up.dtype, down.dtype} <= DTYPES
            and gate_up.device == x.device == down.device == ids.device == weights.device
            and _shapes_fit(x, weights, ids, experts)
        ):
            return super().experts(x, weights, ids, experts, activation)
        from paged_triton import ops

        out: torch.Tensor = ops.moe_experts(x, weights, ids, gate_up, down, activation)
        return out


def _shapes_fit(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts) -> bool:
    """Whether ``x`` ``[T, H]``, ``weights`` and ``ids`` ``[T, k]`` (floats, integers) fit ``experts``."""
    return (
        x.dim() == 2
        and x.shape[1] == experts.hidden_size
        and ids.dim() == 2
        and ids.shape[0] == x.shape[0]
        and tuple(weights.shape) == tuple(ids.shape)
        and weights.is_floating_point()
        and not ids.is_floating_point()
        and ids.dtype != torch.bool
    )
