"""paged-backend-cpu: paged attention for CPUs as C++ torch operators, chosen per ISA at run time."""

from __future__ import annotations

from paged_backend_cpu.backend import CpuBackend
from paged_backend_cpu.fused import CpuFusedOps

__all__ = ["CpuBackend", "CpuFusedOps"]
