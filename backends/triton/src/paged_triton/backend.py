"""TritonBackend: the half of a Triton-kernel backend that does not depend on the vendor.

A vendor package (paged-backend-rocm, paged-backend-xpu) subclasses it and adds what is its own: ``name``,
``priority``, ``availability``, the device check in ``__init__`` and the graph strategy. Validation, the
capability envelope of the kernels and the calls into :mod:`paged_triton.ops` live here once.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

import torch

from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    BackendCapabilities,
    DeviceGraphStrategy,
    EagerStrategy,
    FusedOps,
    GraphCaptureStrategy,
    GraphSupport,
    PagedError,
    check_attention_inputs,
    check_default_cache,
    check_write_inputs,
    is_quantized_kv,
)

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
HEAD_SIZES = frozenset({64, 80, 96, 128, 256})
BLOCK_SIZES = (16, 32, 64)
GQA_RATIOS = frozenset(range(1, 17))
QUANTIZED_KV = frozenset({torch.int8, torch.float8_e4m3fn, torch.float8_e5m2})
"""The quantized KV dtypes the kernels implement (paged_core's default layout: ``head_size + 2`` per vector)."""


def cache_head_size(kv_cache: torch.Tensor) -> int:
    """The head size a default-layout cache holds (a quantized vector carries two more elements: its scale)."""
    return int(kv_cache.shape[4]) - (2 if is_quantized_kv(kv_cache.dtype) else 0)


class TritonBackend(AttentionBackend):
    """Paged attention through the shared Triton kernels: split-K decode with a reduction, tiled causal prefill.

    Every launch takes its sizes from tensor shapes and the metadata's Python ints, never from tensor values,
    so any batch can be captured. Subclasses call :meth:`_load_kernels` once their device check passed.
    """

    api_version = 1
    quantized_kv_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset()
    """Quantized KV dtypes (a subset of :data:`QUANTIZED_KV`) a vendor declares: each opts in for the
    formats its targets compile and convert (see its ahead-of-time check)."""

    def _load_kernels(self) -> None:
        """Import the kernels (and so triton) and check this process's Triton mode can serve the device."""
        from paged_triton import launch, ops

        launch.check_device(self.device)
        self._ops: ModuleType = ops

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """fp32/bf16/fp16 (any mix of compute and cache dtype) plus the vendor's quantized KV dtypes, head sizes
        64-256, blocks 16/32/64, GQA 1-16, sliding windows and soft caps."""
        return BackendCapabilities(
            dtypes=DTYPES,
            kv_cache_dtypes=DTYPES | cls.quantized_kv_dtypes,
            block_sizes=BLOCK_SIZES,
            head_sizes=HEAD_SIZES,
            gqa_ratios=GQA_RATIOS,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.ANY,
        )

    def fused_ops(self) -> FusedOps:
        """The reference's layer ops with the multi-LoRA pair as Triton kernels (:mod:`paged_triton.fused`)."""
        from paged_triton.fused import TritonFusedOps

        return TritonFusedOps()

    def graph_strategy(self) -> GraphCaptureStrategy:
        """Device graphs on a CUDA/HIP or XPU device (any batch: see the class docstring); eager in the interpreter."""
        if self.device.type in ("cuda", "xpu"):
            return DeviceGraphStrategy(self.device.type)
        return EagerStrategy()

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store this step's keys and values at ``metadata.slot_mapping`` (padding slots skipped in-kernel);
        an int8/fp8 cache stores each vector quantized with its scale."""
        check_default_cache(kv_cache, metadata.block_size)
        check_write_inputs(key, value, metadata, kv_cache.shape[3], cache_head_size(kv_cache))
        self._ops.write_kv(key, value, kv_cache, metadata.slot_mapping)

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """Causal attention over the paged cache (window and soft cap as in ``spec``): decode rows first
        (split-K), then prefill rows."""
        check_default_cache(kv_cache, metadata.block_size)
        check_attention_inputs(
            self.capabilities(), query, kv_cache.dtype, (kv_cache.shape[3], cache_head_size(kv_cache)), metadata, spec
        )
        out: torch.Tensor = self._ops.attention(
            query,
            kv_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            metadata.num_decodes,
            metadata.num_prefills,
            metadata.max_query_len,
            metadata.max_seq_len,
            float(spec.softmax_scale),
            float(spec.logits_soft_cap or 0.0),
            int(spec.sliding_window or 0),
        )
        return out

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy (source, destination) block pairs, keys and values, in every layer."""
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        for layer, cache in enumerate(kv_caches):
            if cache.dim() != 5 or cache.shape[0] != 2 or not cache.is_contiguous():
                raise PagedError(f"layer {layer}: kv_cache must be a contiguous [2, blocks, block_size, heads, dim]")
        from paged_triton import launch

        launch.copy_blocks(kv_caches, src_to_dst)
