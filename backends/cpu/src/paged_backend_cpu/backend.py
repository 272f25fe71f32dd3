"""CpuBackend: paged attention through the C++ operators of :mod:`paged_backend_cpu.ops`."""

from __future__ import annotations

import platform
import sys

import torch

from paged_backend_cpu import ops
from paged_backend_cpu.fused import CpuFusedOps
from paged_core.api import (
    QUANTIZED_KV_DTYPES,
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    FusedOps,
    GraphSupport,
    PagedError,
)

_MACHINES = frozenset({"x86_64", "amd64", "aarch64", "arm64"})


def _check_block_size(kv_cache: torch.Tensor, metadata: AttentionMetadata) -> None:
    if kv_cache.dim() != 5 or kv_cache.shape[3] != metadata.block_size:
        raise PagedError(
            f"kv_cache of shape {tuple(kv_cache.shape)} does not hold blocks of metadata.block_size "
            f"{metadata.block_size} (expected [2, num_blocks, kv_heads, block_size, head_size])"
        )


class CpuBackend(AttentionBackend):
    """Native paged attention for CPUs (AVX-512 with BF16 dot products, AVX-512, AVX2 or portable C++).

    Declares fp32, bf16 and fp16 compute with fp32, bf16, fp16, int8,
    float8_e4m3fn and float8_e5m2 KV caches in any combination (fp32
    accumulation throughout), head sizes 64, 80, 96, 128 and 256, block sizes
    16 (preferred), 32, 64 and 128, any GQA ratio, sliding windows (a row's
    key loop starts at its window: blocks before it are never read) and
    logits soft caps, and no graph capture (eager; see the README for the
    measurement behind that choice).

    The KV cache is ``[2, num_blocks, num_kv_heads, block_size, head_size]``:
    each block holds one tile of keys and one of values per KV head. Value
    tiles are stored as the shape reads; key tiles keep dimension pairs
    outermost (see :mod:`paged_backend_cpu.layout`), so that one AVX512-BF16
    dot product scores 16 keys at once. An int8 / float8 cache has the
    default quantized shape (``head_size + 2``: two more bytes per vector for
    its float16 scale, :mod:`paged_core.api` ``quantize_kv``'s rule), each
    tile holding its data bytes in the same layouts followed by its
    ``block_size`` scales; the kernels dequantize as they read.
    """

    name = "cpu"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 50

    @classmethod
    def availability(cls) -> Availability:
        """Available on Linux x86-64 and aarch64 once the extension has loaded; otherwise says why not."""
        machine = platform.machine().lower()
        if not sys.platform.startswith("linux") or machine not in _MACHINES:
            return Availability(False, f"needs Linux on x86-64 or aarch64, this is {sys.platform} on {machine}")
        if ops.LOAD_ERROR is not None:
            return Availability(False, ops.LOAD_ERROR)
        return Availability(True, f"kernels: {ops.isa()}", device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """The declared envelope; the conformance suite tests exactly this (first block size preferred)."""
        dtypes = frozenset({torch.float32, torch.bfloat16, torch.float16})
        return BackendCapabilities(
            dtypes=dtypes,
            kv_cache_dtypes=dtypes | frozenset(QUANTIZED_KV_DTYPES),
            block_sizes=(16, 32, 64, 128),
            head_sizes=frozenset({64, 80, 96, 128, 256}),
            gqa_ratios=None,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.NEVER,
            # Key splits at fixed positions, chunks inside them at fixed positions (a window's first chunk too),
            # masked keys adding exact zeros: a row's bits depend on its own query, keys and position only
            # (csrc/plan.cpp).
            batch_invariant=True,
            extra={"isa": ops.isa() if ops.LOAD_ERROR is None else "unavailable"},
        )

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """``[2, num_blocks, num_kv_heads, block_size, head_size]``: per-head tiles, keys in the pair layout."""
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store this step's keys and values at ``metadata.slot_mapping`` (slots of -1 skipped)."""
        _check_block_size(kv_cache, metadata)
        ops.write_kv(key, value, kv_cache, metadata.slot_mapping)

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """Causal attention over the paged cache for every row (decodes and prefills in one call), with the
        spec's sliding window and soft cap."""
        _check_block_size(kv_cache, metadata)
        return ops.attention(
            query,
            kv_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            spec.softmax_scale,
            sliding_window=spec.sliding_window or 0,
            soft_cap=spec.logits_soft_cap or 0.0,
        )

    _fused: CpuFusedOps | None = None

    def fused_ops(self) -> FusedOps:
        """The layer kernels of :class:`~paged_backend_cpu.fused.CpuFusedOps` (made once per backend)."""
        if self._fused is None:
            self._fused = CpuFusedOps()
        return self._fused

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy (source, destination) block pairs in every layer, in parallel (the pairs are independent)."""
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        ops.copy_blocks(kv_caches, src_to_dst.to(torch.int64))
