"""paged-backend-cuda: paged attention for NVIDIA GPUs, built only on :mod:`paged_core.api`.

Three backends share one package and one set of cache kernels (``write_kv``, ``copy_blocks``):
``cuda`` (own CUDA kernels), ``cuda-flashinfer`` (FlashInfer's paged wrappers, an extra) and
``cuda-flash-attn`` (``flash_attn`` when importable). See the README.
"""

from paged_backend_cuda.backend import CudaBackend

__all__ = ["CudaBackend"]
