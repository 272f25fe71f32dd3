"""paged-backend-cuda: paged attention for NVIDIA GPUs, built only on :mod:`paged_core.api`.

Three backends share one package and one set of cache kernels (``write_kv``, ``copy_blocks``):
``cuda`` (own CUDA kernels), ``cuda-flashinfer`` (FlashInfer's paged wrappers, an extra) and
``cuda-flash-attn`` (``flash_attn`` when importable). See the README.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CudaBackend"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m paged_backend_cuda.build` and the plugin import only what they use.
    if name == "CudaBackend":
        from paged_backend_cuda.backend import CudaBackend

        return CudaBackend
    raise AttributeError(name)
