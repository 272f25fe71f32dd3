"""The multi-LoRA pair of :class:`~paged_backend_cpu.fused.CpuFusedOps`: ``lora_shrink`` and ``lora_expand`` as C++ ops.

The tokens of one adapter are found without sorting (a batch holds each request's tokens together): a run of
16 or more tokens of one slot (expand: 8) is one GEMM on its rows, read in place; the rest of a slot's tokens are
gathered into one GEMM when there are as many, else multiplied one token at a time by AVX2 row kernels reading
the adapter's weights in their own dtype (csrc/lora_ops.cpp). Measured against the reference's per-slot grouping
by ``benchmarks/lora_ops.py`` (README, "Multi-LoRA").
"""

from __future__ import annotations

import torch

from paged_backend_cpu import ops
from paged_core.api import FusedOps

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _native(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype in _DTYPES for t in tensors)


class CpuLoraOps(FusedOps):
    """``lora_shrink`` / ``lora_expand`` through ``torch.ops.paged_cpu`` (custom ops with fake implementations, so
    a compiled step holds each as one node); inputs off the CPU or of other dtypes go to the reference."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """``[T, R]`` fp32, row ``t`` = ``x[t] @ a[slots[t]].T``, zero where ``slots[t] < 0``."""
        if not _native(x, a) or slots.device.type != "cpu":
            return super().lora_shrink(x, a, slots)
        return ops.lora_shrink(x, a, slots)

    def lora_expand(self, y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """In place ``y[t] += shrunk[t] @ b[slots[t]].T`` (rounded once to ``y.dtype``); returns ``y``."""
        if not _native(y, b) or shrunk.device.type != "cpu" or slots.device.type != "cpu":
            return super().lora_expand(y, shrunk, b, slots)
        ops.lora_expand(y, shrunk, b, slots)
        return y
