"""The input checks every backend makes before ``write_kv`` and ``attention``, written once.

A backend passes the KV heads and head size from its own cache layout (which differs between backends), so
the same checks serve every layout. Each raises :class:`~paged_core.errors.PagedError` naming what is wrong
and what was expected; ``attention``'s also runs the declared envelope's ``capabilities.check``.
"""

from __future__ import annotations

import torch

from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import PagedError


def check_write_inputs(
    key: torch.Tensor, value: torch.Tensor, metadata: AttentionMetadata, num_kv_heads: int, head_size: int
) -> None:
    """Keys and values are ``[len(slot_mapping), num_kv_heads, head_size]``; ``slot_mapping`` is int64."""
    expected = (metadata.slot_mapping.shape[0], num_kv_heads, head_size)
    if tuple(key.shape) != expected or tuple(value.shape) != expected:
        raise PagedError(
            f"key {tuple(key.shape)} and value {tuple(value.shape)} must be {list(expected)} "
            f"(one row per slot_mapping entry)"
        )
    if metadata.slot_mapping.dtype != torch.int64:
        raise PagedError(f"slot_mapping must be int64, got {metadata.slot_mapping.dtype}")


def check_attention_inputs(
    capabilities: BackendCapabilities,
    query: torch.Tensor,
    kv_dtype: torch.dtype,
    cache_heads: tuple[int, int],
    metadata: AttentionMetadata,
    spec: AttentionSpec,
) -> None:
    """The cache's ``(kv heads, head size)`` match ``spec``, the query is ``[T, heads, head size]``, the config
    is inside ``capabilities``, and the metadata's index tensors are int32."""
    if tuple(cache_heads) != (spec.num_kv_heads, spec.head_size):
        raise PagedError(
            f"kv_cache heads/head_size {tuple(cache_heads)} do not match the spec "
            f"({spec.num_kv_heads}, {spec.head_size})"
        )
    if query.dim() != 3 or tuple(query.shape[1:]) != (spec.num_heads, spec.head_size):
        raise PagedError(f"query {tuple(query.shape)} must be [T, {spec.num_heads}, {spec.head_size}]")
    capabilities.check(spec, query.dtype, metadata.block_size, kv_dtype)
    for name in ("query_start_loc", "seq_lens", "block_table"):
        if getattr(metadata, name).dtype != torch.int32:
            raise PagedError(f"metadata.{name} must be int32, got {getattr(metadata, name).dtype}")


def check_default_cache(kv_cache: torch.Tensor, block_size: int) -> None:
    """The cache is a contiguous ``[2, blocks, block_size, kv_heads, head_size]`` (the default layout) of this
    block size. A backend with its own ``kv_cache_shape`` checks its layout itself."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise PagedError(f"kv_cache must be [2, num_blocks, block_size, heads, head_size], got {tuple(kv_cache.shape)}")
    if kv_cache.shape[2] != block_size:
        raise PagedError(f"kv_cache block size {kv_cache.shape[2]} != metadata.block_size {block_size}")
    if not kv_cache.is_contiguous():
        raise PagedError("kv_cache must be contiguous")
