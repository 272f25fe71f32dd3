"""TritonFusedOps: the reference's layer ops with the multi-LoRA pair as Triton kernels.

:class:`~paged_triton.backend.TritonBackend` returns it from ``fused_ops()``, so every Triton backend (ROCm, XPU)
runs ``lora_shrink`` / ``lora_expand`` through :mod:`paged_triton.lora_kernels` (custom ops
``paged_triton::lora_shrink`` / ``paged_triton::lora_expand``, capturable: no host reads) and inherits the
reference for the rest. Importing this module does not import triton; the first call does.
"""

from __future__ import annotations

import torch

from paged_core.api import FusedOps

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})


class TritonFusedOps(FusedOps):
    """:class:`FusedOps` with ``lora_shrink`` and ``lora_expand`` launched as Triton kernels (other dtypes, or a
    ``slots`` tensor on another device than the activations, go to the reference)."""

    name = "triton"

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
