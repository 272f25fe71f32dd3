"""The packed weight formats paged reads as they are: GGUF's block formats and int8 weight-only.

A format packs each row of a ``[out_features, in_features]`` weight
independently, ``block_size`` consecutive input features at a time into
``block_bytes`` bytes, so rows can be sliced, concatenated and permuted
without touching the bytes inside them. Byte layouts (little-endian; ``f16``
is IEEE half precision):

=========  ======  =====  =================================================================================
format     block   bytes  one block
=========  ======  =====  =================================================================================
``q4_0``   32      18     ``f16 d``, 16 bytes ``qs``: ``w[j] = d * ((qs[j] & 15) - 8)``,
                          ``w[j + 16] = d * ((qs[j] >> 4) - 8)``
``q4_1``   32      20     ``f16 d``, ``f16 m``, 16 bytes ``qs``: ``w[j] = d * (qs[j] & 15) + m``,
                          ``w[j + 16] = d * (qs[j] >> 4) + m``
``q8_0``   32      34     ``f16 d``, 32 ``int8 q``: ``w[j] = d * q[j]``
``q4_k``   256     144    ``f16 d``, ``f16 dmin``, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of
                          nibbles (8 sub-blocks of 32; see :mod:`paged_core.quant.dequant`)
``q6_k``   256     210    128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 ``int8`` scales, ``f16 d``
``int8``   1       1      ``int8 q`` per weight and one fp32 ``scale`` per output row: ``w[n, k] = scale[n] * q``
=========  ======  =====  =================================================================================

The GGUF formats are those of ggml (``GGMLQuantizationType``), so a GGUF
file's tensor bytes are used unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    """One packed format: its name, block geometry and GGUF type id (``None``: not a GGUF type)."""

    name: str
    block_size: int
    """Input features per block."""
    block_bytes: int
    """Bytes one block takes (for ``int8``, one weight; its per-row scale is stored apart)."""
    ggml_type: int | None

    def row_bytes(self, in_features: int) -> int:
        """Bytes of one packed row of ``in_features`` weights (which must be a multiple of the block)."""
        return in_features // self.block_size * self.block_bytes

    @property
    def bits_per_weight(self) -> float:
        """Storage cost per weight, scales included (``int8``: its per-row scale left out)."""
        return 8.0 * self.block_bytes / self.block_size


Q4_0 = WeightFormat("q4_0", 32, 18, 2)
Q4_1 = WeightFormat("q4_1", 32, 20, 3)
Q8_0 = WeightFormat("q8_0", 32, 34, 8)
Q4_K = WeightFormat("q4_k", 256, 144, 12)
Q6_K = WeightFormat("q6_k", 256, 210, 14)
INT8 = WeightFormat("int8", 1, 1, None)

FORMATS: dict[str, WeightFormat] = {f.name: f for f in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, INT8)}
"""Every format the core can read, by name."""
BY_GGML_TYPE: dict[int, WeightFormat] = {f.ggml_type: f for f in FORMATS.values() if f.ggml_type is not None}
"""The GGUF tensor types kept packed at load, by ggml type id."""


def weight_format(name: str) -> WeightFormat:
    """The format called ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None
