"""The reference dequantizers: pure torch, exact, the oracle every packed-linear kernel is checked against.

Each returns the fp32 weight ``[out_features, in_features]``; the arithmetic
is that of :mod:`paged_core.quant.formats`'s table, done in fp32 (products of
an fp16 scale and a small integer are exact there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from paged_core.quant.formats import INT8, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, WeightFormat
from paged_core.quant.weight import QuantizedWeight


def _blocks(w: QuantizedWeight) -> torch.Tensor:
    """``[N, blocks per row, block_bytes]`` uint8 view of the packed rows."""
    fmt = w.format
    return w.data.reshape(w.out_features, w.in_features // fmt.block_size, fmt.block_bytes)


def _f16(b: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at byte ``offset`` of every block, as fp32 ``[..., 1]``."""
    return b[..., offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: the low nibbles first, then the high ones (ggml's order)."""
    return torch.cat((qs & 15, qs >> 4), dim=-1).float()


def _q4_0(w: QuantizedWeight) -> torch.Tensor:
    b = _blocks(w)
    return _f16(b, 0) * (_nibbles(b[..., 2:18]) - 8.0)


def _q4_1(w: QuantizedWeight) -> torch.Tensor:
    b = _blocks(w)
    return _f16(b, 0) * _nibbles(b[..., 4:20]) + _f16(b, 2)


def _q8_0(w: QuantizedWeight) -> torch.Tensor:
    b = _blocks(w)
    return _f16(b, 0) * b[..., 2:34].contiguous().view(torch.int8).float()


def _q4_k(w: QuantizedWeight) -> torch.Tensor:
    b = _blocks(w)  # [N, S, 144]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc = b[..., 4:16].long()
    # Eight 6-bit scales and mins: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
    # sub-blocks 4-7 take their low 4 bits from bytes 8-11 and their top 2 bits from the top of bytes 0-7.
    low_s, low_m = sc[..., 0:4] & 63, sc[..., 4:8] & 63
    high_s = (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)
    high_m = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    scales = torch.cat((low_s, high_s), -1).float()  # [N, S, 8]
    mins = torch.cat((low_m, high_m), -1).float()
    qs = b[..., 16:144].reshape(*b.shape[:2], 4, 32)  # four chunks of 64 weights
    q = torch.stack((qs & 15, qs >> 4), dim=3).reshape(*b.shape[:2], 8, 32).float()  # sub-block 2c low, 2c+1 high
    out = (d * scales)[..., None] * q - (dmin * mins)[..., None]
    return out.reshape(w.out_features, w.in_features)


def _q6_k(w: QuantizedWeight) -> torch.Tensor:
    b = _blocks(w)  # [N, S, 210]
    lead = b.shape[:2]
    ql = b[..., 0:128].reshape(*lead, 2, 2, 32).long()  # [half, low/high 32 bytes, l]
    qh = b[..., 128:192].reshape(*lead, 2, 32).long()  # [half, l]
    scales = b[..., 192:208].contiguous().view(torch.int8).float().reshape(*lead, 2, 8)
    d = _f16(b, 208)[..., None]  # [N, S, 1, 1]
    # Per half of 128 weights, four quarters of 32: quarter i takes nibble (i >= 2) of ql[i % 2] and bits 2i, 2i+1
    # of qh; each 16 weights share one scale.
    quarters = []
    for i in range(4):
        low = ql[..., i % 2, :] & 15 if i < 2 else ql[..., i % 2, :] >> 4
        high = (qh >> (2 * i)) & 3
        quarters.append((low | (high << 4)) - 32)
    q = torch.stack(quarters, dim=-2).float()  # [N, S, 2, 4, 32]
    sc = scales.reshape(*lead, 2, 4, 2).repeat_interleave(16, dim=-1)  # scale index 2i + l // 16
    return (d[..., None] * sc * q).reshape(w.out_features, w.in_features)


def _int8(w: QuantizedWeight) -> torch.Tensor:
    assert w.scale is not None
    return w.data.float() * w.scale[:, None]


DEQUANTIZERS: dict[WeightFormat, Callable[[QuantizedWeight], torch.Tensor]] = {
    Q4_0: _q4_0,
    Q4_1: _q4_1,
    Q8_0: _q8_0,
    Q4_K: _q4_k,
    Q6_K: _q6_k,
    INT8: _int8,
}


def dequantize(w: QuantizedWeight) -> torch.Tensor:
    """The exact fp32 weight ``[out_features, in_features]`` of ``w``."""
    return DEQUANTIZERS[w.format](w).reshape(w.out_features, w.in_features)


def reference_linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(w).T + bias``, in fp32, rounded once to ``x.dtype`` (the oracle of packed linears)."""
    out = torch.nn.functional.linear(x.float(), dequantize(w), bias.float() if bias is not None else None)
    return out.to(x.dtype)
