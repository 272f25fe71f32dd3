"""paged-backend-cpu: paged attention for CPUs as C++ torch operators, chosen per ISA at run time."""

from __future__ import annotations

from paged_backend_cpu.backend import CpuBackend

__all__ = ["CpuBackend"]
