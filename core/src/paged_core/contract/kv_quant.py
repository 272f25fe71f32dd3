"""Quantized KV caches: the one rounding rule every backend that declares an int8 or fp8 KV dtype follows.

Each key or value vector of one token and one KV head (``head_size`` elements) is stored with its own
scale (per token-head, dynamic): ``scale = float16(max(|x|) / QMAX)`` (at least ``2**-24``, the
smallest float16), then ``q = clamp(x / scale, -QMAX, QMAX)`` rounded to the storage dtype (int8:
to nearest, ties to even; fp8: torch's conversion), and the value read back is ``q * scale``. QMAX
is 127 for int8, 448 for ``float8_e4m3fn`` and 57344 for ``float8_e5m2``.

Where a backend keeps the scales is its own choice (its ``kv_cache_shape_for``). The default layout
appends each vector's float16 scale as two more elements of the storage dtype: a quantized cache is
``kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size + 2)`` in that dtype, and
``cache.view(torch.float16)[..., head_size // 2]`` is the scale. :func:`quantize_kv` and
:func:`dequantize_kv` are that layout's reference arithmetic (pure torch, any device).
"""

from __future__ import annotations

import torch

from paged_core.errors import UnsupportedConfigError

QUANTIZED_KV_DTYPES: dict[torch.dtype, float] = {
    torch.int8: 127.0,
    torch.float8_e4m3fn: 448.0,
    torch.float8_e5m2: 57344.0,
}
"""Quantized KV storage dtypes and their QMAX (the largest magnitude a scaled element takes)."""

KV_SCALE_DTYPE = torch.float16
"""The dtype of each token-head scale."""

KV_SCALE_ELEMENTS = 2
"""Storage elements the default layout appends to each vector for its scale (two bytes of float16)."""

KV_CACHE_DTYPE_NAMES: dict[str, torch.dtype | None] = {
    "auto": None,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
}
"""``--kv-cache-dtype`` values (``auto``: the compute dtype; ``fp8`` is ``fp8_e4m3``, as in vLLM)."""

_MIN_SCALE = 2.0**-24


def is_quantized_kv(dtype: torch.dtype) -> bool:
    """Whether a KV dtype stores scaled vectors (int8, fp8) rather than the values themselves."""
    return dtype in QUANTIZED_KV_DTYPES


def kv_qmax(dtype: torch.dtype) -> float:
    """QMAX of a quantized KV dtype (raises for any other dtype)."""
    try:
        return QUANTIZED_KV_DTYPES[dtype]
    except KeyError:
        raise UnsupportedConfigError(f"{dtype} is not a quantized KV dtype") from None


def kv_scales(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float16 scale of every vector of ``x`` ``[..., head_size]`` (its last dimension dropped)."""
    amax = x.detach().float().abs().amax(dim=-1)
    return (amax / kv_qmax(dtype)).clamp(_MIN_SCALE, torch.finfo(KV_SCALE_DTYPE).max).to(KV_SCALE_DTYPE)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` ``[..., head_size]`` in the default quantized layout: ``[..., head_size + 2]`` of ``dtype``."""
    qmax = kv_qmax(dtype)
    if x.shape[-1] % 2:
        raise UnsupportedConfigError(f"quantized KV caches need an even head_size, got {x.shape[-1]}")
    scale = kv_scales(x, dtype)
    q = (x.float() / scale.float().unsqueeze(-1)).clamp(-qmax, qmax)
    stored = q.round().to(torch.int8) if dtype == torch.int8 else q.to(dtype)
    return torch.cat([stored.view(torch.uint8), scale.unsqueeze(-1).view(torch.uint8)], dim=-1).view(dtype)


def dequantize_kv(packed: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values a default-layout quantized cache holds: ``[..., head_size + 2]`` -> ``[..., head_size]``."""
    head_size = packed.shape[-1] - KV_SCALE_ELEMENTS
    raw = packed.view(torch.uint8)
    scale = raw[..., head_size:].contiguous().view(KV_SCALE_DTYPE).float()
    values = raw[..., :head_size].view(packed.dtype).float()
    return (values * scale).to(out_dtype)
