"""The entry point ``paged_core.backends: xpu`` loads this module; the hook lists the backends.

Importing the tiers' modules is cheap: triton, vllm-xpu-kernels and IPEX's op library load only when a backend
is constructed (or asked whether it is available).
"""

from __future__ import annotations

from paged_backend_xpu.backend import XpuBackend
from paged_backend_xpu.ipex_backend import IpexBackend
from paged_backend_xpu.vllm_kernels_backend import VllmXpuKernelsBackend
from paged_core.api import AttentionBackend, hookimpl


@hookimpl
def paged_register_backends() -> list[type[AttentionBackend]]:
    """The backends this distribution provides: shared Triton kernels, vllm-xpu-kernels, IPEX."""
    return [XpuBackend, VllmXpuKernelsBackend, IpexBackend]
