"""What a quantized KV cache (int8, fp8) must hold: each written vector as :func:`paged_core.api.quantize_kv`
stores it, read back as :func:`paged_core.api.dequantize_kv` reads it.

A backend in the default layout (it overrides neither ``kv_cache_shape`` nor ``kv_cache_shape_for``: the
cache is ``[2, blocks, block_size, kv_heads, head_size + 2]``, each vector's float16 scale in its last two
elements) is read directly, keys and values, every stored byte. A backend with its own layout is read
through attention: a row of one key attends with weight exactly 1, so its output is that key's value as the
cache holds it.
"""

from __future__ import annotations

import torch

from paged_core.api import AttentionBackend, dequantize_kv

TIE_SHARE = 0.01
"""At most this share of the stored codes may differ from the rule's, each by one step (a kernel multiplying
by ``1 / scale`` instead of dividing can round a value sitting on a tie the other way); none by more."""


def default_layout(backend: AttentionBackend) -> bool:
    """Whether the backend keeps the default quantized layout (so its cache can be read byte by byte)."""
    cls = type(backend)
    return (
        cls.kv_cache_shape is AttentionBackend.kv_cache_shape
        and cls.kv_cache_shape_for is AttentionBackend.kv_cache_shape_for
    )


def probe_vectors(count: int, num_kv_heads: int, head_size: int, seed: int) -> torch.Tensor:
    """``[count, num_kv_heads, head_size]`` float32 vectors a quantizer can get wrong: magnitudes from 1e-3 to
    1e3 (scales far apart), one outlier channel per vector (the rest near the rounding grid's bottom), some
    all-zero heads (the minimum scale), random signs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(count, num_kv_heads, head_size, generator=gen)
    x *= 10 ** (6 * torch.rand(count, num_kv_heads, 1, generator=gen) - 3)
    outlier = torch.randint(0, head_size, (count, num_kv_heads, 1), generator=gen)
    x.scatter_(-1, outlier, 30 * x.abs().amax(-1, keepdim=True))
    x[::7, 0] = 0.0
    return x


def code_mismatch(actual: torch.Tensor, expected: torch.Tensor, what: str) -> str | None:
    """Compare two default-layout packs ``[..., head_size + 2]``: values and scales as stored codes. ``None`` when
    they agree (up to :data:`TIE_SHARE` one-step ties), else what differs."""
    head_size = expected.shape[-1] - 2
    a, e = actual.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    scale_a = a[..., head_size:].contiguous().view(torch.int16).flatten()
    scale_e = e[..., head_size:].contiguous().view(torch.int16).flatten()
    if not torch.equal(scale_a, scale_e):
        bad = int((scale_a != scale_e).sum())
        first = int((scale_a != scale_e).nonzero()[0])
        sa, se = (t.view(torch.float16)[first].item() for t in (scale_a, scale_e))
        return f"{what}: {bad}/{scale_e.numel()} scales differ from float16(max|x| / QMAX) (first: {sa} != {se})"
    # Codes of int8 and of fp8 of one sign are ordered: one step apart is one apart as signed bytes.
    va, ve = a[..., :head_size].view(torch.int8).int(), e[..., :head_size].view(torch.int8).int()
    diff = (va - ve).abs()
    if expected.dtype != torch.int8:  # fp8: a differing sign bit is no neighbour
        diff = torch.where((va < 0) != (ve < 0), torch.full_like(diff, 255), diff)
    far, near = int((diff > 1).sum()), int((diff == 1).sum())
    if far or near > TIE_SHARE * diff.numel():
        return (
            f"{what}: {far} stored values differ from quantize_kv by more than one step and {near}/{diff.numel()} by "
            f"one (at most {TIE_SHARE:.0%} may, at rounding ties)"
        )
    return None


OUTPUT_ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
"""Relative rounding of an attention output in each compute dtype."""


def value_mismatch(actual: torch.Tensor, packed: torch.Tensor, out_dtype: torch.dtype, what: str) -> str | None:
    """Values read back through attention ``[count, kv_heads, head_size]`` (returned in ``out_dtype``) against
    ``packed`` (the rule's pack of the same values): each within one quantization step of
    ``dequantize_kv(packed)``, plus the output's own rounding; exact in float32 but at ties."""
    want = dequantize_kv(packed)
    scale = packed.contiguous().view(torch.uint8)[..., -2:].contiguous().view(torch.float16).float()
    # One step: the scale for int8; for fp8 the spacing at that value (2**-3 or 2**-2 of it), at least the scale.
    rel = {torch.int8: 0.0, torch.float8_e4m3fn: 2.0**-3, torch.float8_e5m2: 2.0**-2}[packed.dtype]
    rounding = want.abs() * OUTPUT_ROUNDING.get(out_dtype, 2.0**-8)
    step = torch.maximum(scale, want.abs() * rel) * 1.001 + rounding
    err = (actual.float() - want).abs()
    err = torch.where(err <= rounding, torch.zeros_like(err), err)  # the output dtype's rounding is no mismatch
    far = err > step
    near = (err > 0) & ~far
    if far.any() or int(near.sum()) > TIE_SHARE * err.numel():
        worst = int(err.flatten().argmax())
        return (
            f"{what}: {int(far.sum())}/{err.numel()} values read back differ from dequantize_kv(quantize_kv(v)) by "
            f"more than one step, {int(near.sum())} by less (worst {err.flatten()[worst]:.3g} against "
            f"{want.flatten()[worst]:.3g})"
        )
    return None
