"""paged-backend-xpu: paged attention on Intel GPUs (``torch.xpu``), testable on CPU.

Three backends: ``xpu`` (the Triton kernels shared with paged-backend-rocm, through :mod:`paged_triton`, with
Intel tiles), ``xpu-vllm-kernels`` (vllm-xpu-kernels' SYCL flash attention) and ``xpu-ipex`` (IPEX's paged
ops). Importing the package imports none of triton, vllm-xpu-kernels or IPEX.
"""

from __future__ import annotations

from paged_backend_xpu.backend import XpuBackend
from paged_backend_xpu.environment import INTERPRET_ENV

__all__ = ["INTERPRET_ENV", "XpuBackend"]
