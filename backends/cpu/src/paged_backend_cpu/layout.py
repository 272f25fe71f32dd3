"""The cpu backend's KV-cache layout, and conversions to and from the core's default layout.

The cpu backend's cache is ``[2, num_blocks, num_kv_heads, block_size, head_size]``:
per block and KV head, one ``[block_size, head_size]`` tile of keys (plane 0) and
one of values (plane 1). Value tiles are stored as that shape reads. Key tiles
are stored with dimension pairs outermost: the tile's memory is
``[head_size // 2, block_size, 2]``, so key ``j``'s dimensions ``2i`` and ``2i + 1``
sit at flat offset ``(i * block_size + j) * 2``. One 64-byte line then holds one
dimension pair of 16 bf16 keys, the operand of an AVX512-BF16 dot product that
scores those 16 keys at once.

A quantized cache (int8, float8_e4m3fn, float8_e5m2; :func:`paged_core.api.quantize_kv`'s
rule: one float16 scale per token and KV head) has the core's default quantized shape,
``[2, num_blocks, num_kv_heads, block_size, head_size + 2]`` of 1-byte elements, so the
scales cost the 2 bytes per vector the KV budget counts. Each tile's
``block_size * (head_size + 2)`` bytes hold its ``block_size * head_size`` data bytes
first, in the layouts above (keys in pairs, values row-major), then the ``block_size``
float16 scales of its vectors in slot order (where one load gives 16 keys' scales).

The kernels never need these functions; they are for tests, benchmarks and
anyone inspecting a cache.
"""

from __future__ import annotations

import torch

from paged_core.api import is_quantized_kv

SCALE_BYTES = 2
"""Bytes of each vector's float16 scale in a quantized cache."""


def _pairs(tiles: torch.Tensor) -> torch.Tensor:
    """``[..., block_size, head_size]`` row-major tiles -> their pair-layout memory ``[..., D/2, block_size, 2]``."""
    *lead, block_size, head_size = tiles.shape
    return tiles.reshape(*lead, block_size, head_size // 2, 2).transpose(-3, -2)


def _unpairs(memory: torch.Tensor, block_size: int, head_size: int) -> torch.Tensor:
    """Pair-layout tile memory ``[..., block_size * head_size]`` -> row-major ``[..., block_size, head_size]``."""
    lead = memory.shape[:-1]
    pairs = memory.reshape(*lead, head_size // 2, block_size, 2)
    return pairs.transpose(-3, -2).reshape(*lead, block_size, head_size)


def _check(cache: torch.Tensor, shape: str) -> None:
    if cache.dim() != 5 or cache.shape[0] != 2:
        raise ValueError(f"expected {shape}, got {tuple(cache.shape)}")


def from_standard(cache: torch.Tensor) -> torch.Tensor:
    """A default-layout cache ``[2, num_blocks, block_size, kv_heads, head_size]`` in the cpu backend's layout.

    A quantized cache's last dimension is ``head_size + 2`` in both layouts (each vector's scale).
    """
    _check(cache, "[2, num_blocks, block_size, kv_heads, head_size]")
    tiles = cache.transpose(2, 3)  # [2, num_blocks, kv_heads, block_size, width]
    if not is_quantized_kv(cache.dtype):
        keys = _pairs(tiles[0]).contiguous().view(tiles[0].shape)
        return torch.stack([keys, tiles[1].contiguous()])
    raw = tiles.view(torch.uint8)
    _, blocks, heads, block_size, width = raw.shape
    head_size = width - SCALE_BYTES
    keys = _pairs(raw[0, ..., :head_size]).reshape(blocks, heads, block_size * head_size)
    values = raw[1, ..., :head_size].reshape(blocks, heads, block_size * head_size)
    scales = raw[..., head_size:].reshape(2, blocks, heads, block_size * SCALE_BYTES)
    out = torch.cat([torch.stack([keys, values]), scales], dim=-1)
    return out.view(2, blocks, heads, block_size, width).view(cache.dtype)


def to_standard(cache: torch.Tensor) -> torch.Tensor:
    """The cpu backend's cache as a default-layout ``[2, num_blocks, block_size, kv_heads, head_size]`` copy."""
    _check(cache, "[2, num_blocks, kv_heads, block_size, head_size]")
    _, blocks, heads, block_size, width = cache.shape
    if not is_quantized_kv(cache.dtype):
        keys = _unpairs(cache[0].reshape(blocks, heads, block_size * width), block_size, width)
        return torch.stack([keys, cache[1]]).transpose(2, 3).contiguous()
    head_size = width - SCALE_BYTES
    flat = cache.view(torch.uint8).reshape(2, blocks, heads, block_size * width)
    data = flat[..., : block_size * head_size]
    keys = _unpairs(data[0], block_size, head_size)
    values = data[1].reshape(blocks, heads, block_size, head_size)
    scales = flat[..., block_size * head_size :].reshape(2, blocks, heads, block_size, SCALE_BYTES)
    tiles = torch.cat([torch.stack([keys, values]), scales], dim=-1)
    return tiles.transpose(2, 3).contiguous().view(cache.dtype)
