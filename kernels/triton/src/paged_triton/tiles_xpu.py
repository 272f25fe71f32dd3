"""Intel GPU (pvc, dg2) tiles and launch options. PROVISIONAL: replaced by the measured, spill-free choice."""

from __future__ import annotations

import torch

from paged_triton.tile_shape import DECODE_BLOCK_M, AttentionTiles, head_pad

XPU_THREADS_PER_WARP = 16
"""Sub-group size the kernels are launched with on Intel GPUs."""


def xpu_attention_tiles(
    dtype: torch.dtype, head_size: int, block_size: int, decode: bool, split: bool, kv_dtype: torch.dtype | None = None
) -> AttentionTiles:
    """Tiles for an Intel GPU: 16-key tiles, 16-row prefill tiles, 64-wide q.k chunks."""
    pad = head_pad(head_size)
    return AttentionTiles(pad, DECODE_BLOCK_M, 16, split and decode, min(pad, 64), 256)


def xpu_options(kernel: str) -> dict[str, object]:
    """Extra launch options on Intel GPUs for ``kernel``."""
    return {"threads_per_warp": XPU_THREADS_PER_WARP}
