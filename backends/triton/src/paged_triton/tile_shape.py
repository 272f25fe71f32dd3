"""The compile-time shape of one attention launch (shared by every family's tile choice)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SPLITS = 32
"""Most partitions a decode row's context is split into (the reduction kernel's fixed width)."""
ATTENTION_LANES = 256
"""Default threads per attention program: 4 waves of 64 on CDNA, 8 warps of 32 on NVIDIA/RDNA."""
DECODE_BLOCK_M = 16
"""Query rows of a decode program: one token times up to 16 query heads (tl.dot needs M >= 16)."""


def head_pad(head_size: int) -> int:
    """The power-of-two tile width covering ``head_size`` (at least 16)."""
    return max(16, 1 << (head_size - 1).bit_length())


@dataclass(frozen=True)
class AttentionTiles:
    """Compile-time shape of one attention launch."""

    head_pad: int
    block_m: int
    block_n: int
    split: bool
    d_chunk: int
    """Head-dim width of one q.k dot (``head_pad`` except where wide dot operands spill: RDNA, Intel)."""
    lanes: int = ATTENTION_LANES
    """Threads per program; warps (sub-groups) = lanes // the device's warp size."""

    def constexprs(self, dot_fp32: bool, window: bool = False, soft_cap: bool = False) -> dict[str, int | bool]:
        """The kernel's ``tl.constexpr`` arguments for these tiles (and the layer's features: a sliding window,
        a soft cap)."""
        return {
            "HEAD_PAD": self.head_pad,
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "SPLIT": self.split,
            "MAX_SPLITS": MAX_SPLITS,
            "DOT_FP32": dot_fp32,
            "D_CHUNK": self.d_chunk,
            "WINDOW": window,
            "SOFT_CAP": soft_cap,
        }
