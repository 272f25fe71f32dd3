"""The reference backend: pure torch, slow, obviously correct; the conformance suite's oracle."""

from __future__ import annotations

import torch

from paged_core.contract.backend import AttentionBackend, Availability
from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities, GraphSupport
from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.inputs import check_default_cache
from paged_core.contract.kv_quant import (
    KV_SCALE_ELEMENTS,
    QUANTIZED_KV_DTYPES,
    dequantize_kv,
    is_quantized_kv,
    quantize_kv,
)
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import PagedError
from paged_core.reference.dense import attend, expand_kv
from paged_core.reference.fused import ReferenceFusedOps

_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
_KV_DTYPES = _DTYPES | frozenset(QUANTIZED_KV_DTYPES)
"""Any float dtype whatever the compute dtype, and the quantized ones of :mod:`paged_core.contract.kv_quant`."""


def _head_size(kv_cache: torch.Tensor) -> int:
    """The head size a cache holds: its last dimension, less the scale of a quantized (default-layout) one."""
    return kv_cache.shape[4] - (KV_SCALE_ELEMENTS if is_quantized_kv(kv_cache.dtype) else 0)


def _read(cache_part: torch.Tensor) -> torch.Tensor:
    """Cached keys or values as the values they hold: dequantized (float32) for a quantized cache."""
    return dequantize_kv(cache_part) if is_quantized_kv(cache_part.dtype) else cache_part


class ReferenceBackend(AttentionBackend):
    """Row-by-row paged attention: gather each row's KV into a dense tensor, then attend densely.

    Runs on whatever torch device it is constructed with. It loops in Python
    and reads metadata on the host, so it can never be captured in a graph.
    It is batch-invariant (``capabilities().batch_invariant``): each query
    token attends on its own over exactly its visible keys, so its bits never
    depend on the batch (torch's batched matmuls change their summation order
    with the number of query rows: measured, a prefill chunk and decode rows
    at the same positions differed). Its layer ops are
    :class:`~paged_core.reference.fused.ReferenceFusedOps`, row by row too.

    The KV cache may be any float dtype, whatever the compute dtype, or int8/fp8 in the default quantized
    layout of :mod:`paged_core.contract.kv_quant` (:func:`~paged_core.contract.kv_quant.quantize_kv` on
    write, :func:`~paged_core.contract.kv_quant.dequantize_kv` on read). Quantized caches stay
    batch-invariant: each vector's scale is its own (per token-head), so its stored bits depend on that
    vector alone, and it is read back elementwise.
    """

    name = "reference"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 0

    @classmethod
    def availability(cls) -> Availability:
        """Always available (default device: CPU)."""
        return Availability(available=True, device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """Everything the contract can express, except graph capture (quantized KV caches included)."""
        return BackendCapabilities(
            dtypes=_DTYPES,
            kv_cache_dtypes=_KV_DTYPES,
            block_sizes=(16, 1, 2, 4, 8, 32, 64, 128, 256),
            head_sizes=None,
            gqa_ratios=None,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.NEVER,
            batch_invariant=True,
        )

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store each token's key/value at its slot (quantized for an int8/fp8 cache); slots of -1 are skipped."""
        check_default_cache(kv_cache, metadata.block_size)
        num_slots = kv_cache.shape[1] * kv_cache.shape[2]
        kv_heads, head_size = kv_cache.shape[3], _head_size(kv_cache)
        slots = metadata.slot_mapping
        expected = (slots.shape[0], kv_heads, head_size)
        if tuple(key.shape) != expected or tuple(value.shape) != expected:
            raise PagedError(
                f"key {tuple(key.shape)} and value {tuple(value.shape)} must be {list(expected)} "
                "(one row per slot_mapping entry)"
            )
        valid = slots >= 0
        targets = slots[valid]
        if targets.numel() and int(targets.max()) >= num_slots:
            raise PagedError(f"slot_mapping holds slot {int(targets.max())} but the cache has only {num_slots} slots")
        flat = kv_cache.view(2, num_slots, kv_heads, kv_cache.shape[4])
        if is_quantized_kv(kv_cache.dtype):
            flat[0, targets] = quantize_kv(key[valid], kv_cache.dtype)
            flat[1, targets] = quantize_kv(value[valid], kv_cache.dtype)
        else:
            flat[0, targets] = key[valid].to(kv_cache.dtype)
            flat[1, targets] = value[valid].to(kv_cache.dtype)

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """For each row: gather its cached keys/values (positions ``0..seq_len-1``) and attend densely."""
        check_default_cache(kv_cache, metadata.block_size)
        if (kv_cache.shape[3], _head_size(kv_cache)) != (spec.num_kv_heads, spec.head_size):
            raise PagedError(
                f"kv_cache heads/head_size {(kv_cache.shape[3], _head_size(kv_cache))} do not match the spec "
                f"({spec.num_kv_heads}, {spec.head_size})"
            )
        block_size = metadata.block_size
        out = torch.zeros_like(query)
        qsl = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        tables = metadata.block_table.tolist()
        if len(qsl) != len(seq_lens) + 1 or len(tables) != len(seq_lens):
            raise PagedError(
                f"inconsistent metadata: {len(qsl)} query_start_loc entries, {len(seq_lens)} seq_lens, "
                f"{len(tables)} block-table rows"
            )
        if qsl[-1] > query.shape[0]:
            raise PagedError(f"query_start_loc ends at {qsl[-1]} but query has {query.shape[0]} tokens")
        for b, seq_len in enumerate(seq_lens):
            start, end = qsl[b], qsl[b + 1]
            q_len = end - start
            if q_len <= 0 or seq_len < q_len:
                raise PagedError(f"row {b}: need 0 < query_len <= seq_len, got {q_len} and {seq_len}")
            num_blocks = -(-seq_len // block_size)
            if num_blocks > len(tables[b]):
                raise PagedError(f"row {b}: seq_len {seq_len} needs {num_blocks} blocks, table has {len(tables[b])}")
            blocks = torch.tensor(tables[b][:num_blocks], dtype=torch.int64, device=kv_cache.device)
            width = kv_cache.shape[4]
            keys = _read(kv_cache[0, blocks].reshape(-1, spec.num_kv_heads, width)[:seq_len])
            values = _read(kv_cache[1, blocks].reshape(-1, spec.num_kv_heads, width)[:seq_len])
            kf, vf = expand_kv(keys, values, spec)
            context = seq_len - q_len
            for t in range(q_len):
                # Batch invariance: each token attends alone over exactly the keys it sees (positions
                # lo..pos, the rule of dense.visibility_mask), in new tensors whose shapes, strides and
                # offsets depend on that token only: a decode row and the same position inside a prefill
                # chunk of any size, in any batch, run the same arithmetic on the same bits.
                pos = context + t
                lo = max(0, pos + 1 - spec.sliding_window) if spec.sliding_window is not None else 0
                row = query[start + t].clone(memory_format=torch.contiguous_format).unsqueeze(0)
                out[start + t] = attend(row, kf[lo : pos + 1], vf[lo : pos + 1], spec)[0]
        return out

    def fused_ops(self) -> FusedOps:
        """:class:`~paged_core.reference.fused.ReferenceFusedOps`: the reference arithmetic, one row at a time."""
        return ReferenceFusedOps()

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy keys and values of each (source, destination) block pair, in order, in every layer."""
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        pairs = src_to_dst.tolist()
        for layer, cache in enumerate(kv_caches):
            if cache.dim() != 5 or cache.shape[0] != 2:
                raise PagedError(f"layer {layer}: kv_cache must be [2, blocks, block_size, heads, dim]")
            for src, dst in pairs:
                if not (0 <= src < cache.shape[1] and 0 <= dst < cache.shape[1]):
                    raise PagedError(f"block pair ({src}, {dst}) out of range for {cache.shape[1]} blocks")
                cache[:, dst] = cache[:, src]
