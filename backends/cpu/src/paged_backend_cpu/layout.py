"""The cpu backend's KV-cache layout, and conversions to and from the core's default layout.

The cpu backend's cache is ``[2, num_blocks, num_kv_heads, block_size, head_size]``:
per block and KV head, one ``[block_size, head_size]`` tile of keys (plane 0) and
one of values (plane 1). Value tiles are stored as that shape reads. Key tiles
are stored with dimension pairs outermost: the tile's memory is
``[head_size // 2, block_size, 2]``, so key ``j``'s dimensions ``2i`` and ``2i + 1``
sit at flat offset ``(i * block_size + j) * 2``. One 64-byte line then holds one
dimension pair of 16 bf16 keys, the operand of an AVX512-BF16 dot product that
scores those 16 keys at once.

The kernels never need these functions; they are for tests, benchmarks and
anyone inspecting a cache.
"""

from __future__ import annotations

import torch


def _pairs(tiles: torch.Tensor) -> torch.Tensor:
    """``[..., block_size, head_size]`` row-major tiles -> their pair-layout memory ``[..., D/2, block_size, 2]``."""
    *lead, block_size, head_size = tiles.shape
    return tiles.reshape(*lead, block_size, head_size // 2, 2).transpose(-3, -2)


def from_standard(cache: torch.Tensor) -> torch.Tensor:
    """A default-layout cache ``[2, num_blocks, block_size, kv_heads, head_size]`` in the cpu backend's layout."""
    if cache.dim() != 5 or cache.shape[0] != 2:
        raise ValueError(f"expected [2, num_blocks, block_size, kv_heads, head_size], got {tuple(cache.shape)}")
    tiles = cache.transpose(2, 3)  # [2, num_blocks, kv_heads, block_size, head_size]
    keys = _pairs(tiles[0]).contiguous().view(tiles[0].shape)
    return torch.stack([keys, tiles[1].contiguous()])


def to_standard(cache: torch.Tensor) -> torch.Tensor:
    """The cpu backend's cache as a default-layout ``[2, num_blocks, block_size, kv_heads, head_size]`` copy."""
    if cache.dim() != 5 or cache.shape[0] != 2:
        raise ValueError(f"expected [2, num_blocks, kv_heads, block_size, head_size], got {tuple(cache.shape)}")
    _, blocks, heads, block_size, head_size = cache.shape
    pairs = cache[0].contiguous().view(blocks, heads, head_size // 2, block_size, 2)
    keys = pairs.transpose(2, 3).reshape(blocks, heads, block_size, head_size)
    return torch.stack([keys, cache[1]]).transpose(2, 3).contiguous()
