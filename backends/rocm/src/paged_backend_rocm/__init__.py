"""paged-backend-rocm: Triton paged-attention kernels for AMD GPUs (HIP graphs), testable on CPU.

Importing the package does not import triton: the kernels load on first use, after the interpreter
mode (``PAGED_ROCM_INTERPRET=1``) had its chance to be set.
"""

from __future__ import annotations

from paged_backend_rocm.backend import RocmBackend
from paged_backend_rocm.environment import ALLOW_CUDA_ENV, INTERPRET_ENV

__all__ = ["ALLOW_CUDA_ENV", "INTERPRET_ENV", "RocmBackend"]
