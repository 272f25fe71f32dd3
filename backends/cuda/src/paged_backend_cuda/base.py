"""What the three CUDA backends share: device checks, the cache layout, ``write_kv``, ``copy_blocks``, graphs.

Every tier keeps paged's default cache ``[2, blocks, block_size, kv_heads, head_size]`` (FlashInfer's NHD
pair and flash-attn's ``[blocks, block, kv_heads, head]`` are its two halves), and stores keys and values
with this package's own ``write_kv`` kernel, which skips slot ``-1`` in the kernel (neither library has
that notion), so every tier's step captures into a CUDA graph.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import ClassVar

import torch

from paged_backend_cuda import environment
from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    DeviceGraphStrategy,
    EagerStrategy,
    FusedOps,
    GraphCaptureStrategy,
    PagedError,
    check_attention_inputs,
    check_default_cache,
    check_write_inputs,
)


class CudaBackendBase(AttentionBackend):
    """Shared half of the CUDA backends; subclasses add ``attention``, ``capabilities`` and ``availability``."""

    api_version = 1
    emulatable: ClassVar[bool] = False
    """Whether ``PAGED_CUDA_EMULATE=1`` may run this backend's kernels on CPU tensors (own kernels only)."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        self._kernels: ModuleType = _kernel_module(self.device)
        if self.device.type == "cpu" and self.emulatable and environment.emulate_requested():
            return
        if self.device.type != "cuda":
            raise PagedError(
                f"{type(self).__name__} runs on cuda devices, not {self.device} (on a CPU use the cpu backend)"
            )
        why = environment.refusal()
        if why is None:
            why = environment.device_refusal(self.device)
        if why is not None:
            raise PagedError(f"{type(self).__name__} cannot run here: {why}")

    def fused_ops(self) -> FusedOps:
        """The layer ops (:func:`fused_ops_for`): the shared Triton kernels on a CUDA device, else the reference."""
        return fused_ops_for(self.device)

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store this step's keys and values at ``metadata.slot_mapping``; slot ``-1`` is skipped in the kernel."""
        check_default_cache(kv_cache, metadata.block_size)
        check_write_inputs(key, value, metadata, kv_cache.shape[3], kv_cache.shape[4])
        self._kernels.write_kv(key, value, kv_cache, metadata.slot_mapping)

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy (source, destination) block pairs, keys and values, in every layer (one launch per layer)."""
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        for layer, cache in enumerate(kv_caches):
            if cache.dim() != 5 or cache.shape[0] != 2 or not cache.is_contiguous():
                raise PagedError(f"layer {layer}: kv_cache must be a contiguous [2, blocks, block_size, heads, dim]")
        if src_to_dst.shape[0] == 0:
            return
        pairs = src_to_dst.to(device=self.device, dtype=torch.int64).contiguous()
        for cache in kv_caches:
            self._kernels.copy_blocks(cache, pairs)

    def graph_strategy(self) -> GraphCaptureStrategy:
        """CUDA graphs through ``torch.cuda.CUDAGraph`` (eager replay in the CPU emulation)."""
        return DeviceGraphStrategy("cuda") if self.device.type == "cuda" else EagerStrategy()

    def check_attention_inputs(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> None:
        """Shapes, dtypes and the declared envelope; raises naming every mismatch it finds first."""
        check_default_cache(kv_cache, metadata.block_size)
        check_attention_inputs(
            self.capabilities(), query, kv_cache.dtype, (kv_cache.shape[3], kv_cache.shape[4]), metadata, spec
        )


def _kernel_module(device: torch.device) -> ModuleType:
    """The kernels' Python calls: compiled CUDA on a GPU, the CPU emulation on CPU tensors (loaded lazily)."""
    if device.type == "cpu":
        from paged_backend_cuda import emulated

        return emulated
    from paged_backend_cuda import kernels

    return kernels


def fused_ops_for(device: torch.device) -> FusedOps:
    """On a CUDA device where Triton imports (torch's CUDA wheels bring it): paged-triton's layer ops, whose
    multi-LoRA pair and routed experts are Triton kernels (the rest is the reference's). Elsewhere (emulation on
    CPU tensors, no Triton): the reference. This package's own kernels are attention and cache ones only."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        from paged_triton.fused import TritonFusedOps

        return TritonFusedOps()
    return FusedOps()
