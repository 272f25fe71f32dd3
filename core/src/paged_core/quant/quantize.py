"""Making packed weights: int8 weight-only at load (``--quantization int8``), and GGUF blocks for tests.

:func:`quantize_int8` is what the engine applies to a bf16/fp32 checkpoint's
linear weights. :func:`quantize_blocks` writes ``q4_0``/``q4_1``/``q8_0``
blocks from a dense weight (round to nearest, ggml's scale conventions), so
tests and the conformance suite can build packed models from random weights;
:func:`random_packed` fills any format with random bytes and finite scales.
"""

from __future__ import annotations

import torch

from paged_core.quant.formats import INT8, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, WeightFormat
from paged_core.quant.weight import QuantizedWeight


def quantize_int8(weight: torch.Tensor, name: str = "weight") -> QuantizedWeight:
    """Symmetric per-output-row int8: ``scale = max|w| / 127``, ``q = round(w / scale)`` in [-127, 127]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight(INT8, (int(w.shape[0]), int(w.shape[1])), q.contiguous(), scale.contiguous(), name)


def _f16_bytes(values: torch.Tensor) -> torch.Tensor:
    """fp32 ``[..., 1]`` -> its fp16 bytes ``[..., 2]``."""
    return values.to(torch.float16).contiguous().view(torch.uint8)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """32 values in [0, 15] per block -> 16 bytes: value j in the low nibble of byte j, value j + 16 in the high."""
    q = q.to(torch.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def quantize_blocks(weight: torch.Tensor, fmt: WeightFormat, name: str = "weight") -> QuantizedWeight:
    """``weight`` ``[N, K]`` packed as ``q4_0``, ``q4_1`` or ``q8_0`` (``K`` a multiple of 32)."""
    w = weight.detach().float()
    n, k = int(w.shape[0]), int(w.shape[1])
    if k % 32:
        raise ValueError(f"{name}: in_features {k} is not a multiple of 32")
    b = w.reshape(n, k // 32, 32)
    if fmt is Q8_0:
        d = b.abs().amax(-1, keepdim=True) / 127.0
        d16 = d.to(torch.float16).float()
        inv = torch.where(d16 > 0, 1.0 / d16, torch.zeros_like(d16))
        q = torch.round(b * inv).clamp_(-127, 127).to(torch.int8).view(torch.uint8)
        blocks = torch.cat((_f16_bytes(d), q), -1)
    elif fmt is Q4_0:
        # ggml's convention: the value of largest magnitude maps to -8, so d = that value / -8.
        idx = b.abs().argmax(-1, keepdim=True)
        d = b.gather(-1, idx) / -8.0
        d16 = d.to(torch.float16).float()
        inv = torch.where(d16 != 0, 1.0 / d16, torch.zeros_like(d16))
        q = torch.round(b * inv + 8.0).clamp_(0, 15)
        blocks = torch.cat((_f16_bytes(d), _pack_nibbles(q)), -1)
    elif fmt is Q4_1:
        lo, hi = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
        d = (hi - lo) / 15.0
        d16, m16 = d.to(torch.float16).float(), lo.to(torch.float16).float()
        inv = torch.where(d16 > 0, 1.0 / d16, torch.zeros_like(d16))
        q = torch.round((b - m16) * inv).clamp_(0, 15)
        blocks = torch.cat((_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)), -1)
    else:
        raise ValueError(f"{name}: quantize_blocks makes q4_0, q4_1 and q8_0, not {fmt.name}")
    return QuantizedWeight(fmt, (n, k), blocks.reshape(n, fmt.row_bytes(k)).contiguous(), None, name)


_SCALE_OFFSETS: dict[WeightFormat, tuple[int, ...]] = {Q4_0: (0,), Q4_1: (0, 2), Q8_0: (0,), Q4_K: (0, 2), Q6_K: (208,)}
"""Byte offsets of each block's fp16 scales (random bytes there could be inf or NaN)."""


def random_packed(
    fmt: WeightFormat,
    out_features: int,
    in_features: int,
    generator: torch.Generator | None = None,
    scale: float = 0.02,
    name: str = "weight",
) -> QuantizedWeight:
    """Random packed bytes of ``fmt`` with finite fp16 scales of magnitude about ``scale`` (tests, conformance)."""
    if fmt is INT8:
        q = torch.randint(-127, 128, (out_features, in_features), generator=generator, dtype=torch.int8)
        s = torch.rand(out_features, generator=generator) * scale / 64 + scale / 256
        return QuantizedWeight(INT8, (out_features, in_features), q, s, name)
    nb = in_features // fmt.block_size
    data = torch.randint(0, 256, (out_features, nb, fmt.block_bytes), generator=generator, dtype=torch.uint8)
    q_range = {"q4_0": 8, "q4_1": 15, "q8_0": 127, "q4_k": 15 * 63, "q6_k": 32 * 127}[fmt.name]
    for off in _SCALE_OFFSETS[fmt]:
        sign = 1.0 if fmt is not Q4_1 or off == 0 else -1.0  # q4_1's min is usually negative
        values = sign * (torch.rand(out_features, nb, 1, generator=generator) + 0.5) * scale / q_range * 4
        if fmt is Q4_1 and off == 2:
            values = values * q_range / 8  # the min is about half the block's range
        data[..., off : off + 2] = _f16_bytes(values)
    return QuantizedWeight(fmt, (out_features, in_features), data.reshape(out_features, -1).contiguous(), None, name)
