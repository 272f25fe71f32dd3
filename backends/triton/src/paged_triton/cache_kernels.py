# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so the kernel parameters stay unannotated.)
"""Triton source of the KV-cache kernels: store new keys/values at their slots, and copy whole blocks.

Undecorated for the same reason as :mod:`paged_triton.attention_kernels`.

An 8-bit cache (int8, float8_e4m3fn, float8_e5m2) is quantized, bit for bit as
:func:`paged_core.api.quantize_kv`: per token-head ``scale = float16(max|x| / QMAX)`` (clamped to
``[2**-24, 65504]``), ``q = clamp(x / scale, -QMAX, QMAX)`` rounded to nearest, ties to even, stored in the
vector's ``head_size`` elements with the scale's two bytes after them. Divisions are ``div_rn`` (plain
fp32 ``/`` is approximate on NVIDIA GPUs). fp8 values are rounded onto the format's grid in fp32 first, so
the final conversion is exact whatever its rounding (the Triton interpreter's fp32 -> fp8 conversion drops
the carry of a round-up into the exponent and rounds ties away from zero).
"""

from __future__ import annotations

import triton.language as tl


def write_kv_kernel(
    key_ptr,  # [T, kv_heads, HEAD] (any strides)
    value_ptr,
    k_cache_ptr,  # [num_blocks, block_size, kv_heads, HEAD] (the key plane; last dim contiguous)
    v_cache_ptr,
    slot_mapping_ptr,  # int64 [T]; -1 marks padding, never written
    block_size,
    head_size,
    stride_kt,  # the last dim of key and value is contiguous (the launcher guarantees it)
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    # Padding tokens run the program but store nothing: a masked store, no branch on the host.
    slot_safe = tl.maximum(slot, 0)
    offs_d = tl.arange(0, HEAD_PAD)
    # (The slot test is broadcast explicitly: the interpreter rejects a scalar bool mixed into a block mask.)
    mask = (offs_d < head_size) & (offs_d * 0 + slot >= 0)
    k = tl.load(key_ptr + token * stride_kt + kv_head * stride_kh + offs_d, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + kv_head * stride_vh + offs_d, mask=mask)
    row = (slot_safe // block_size) * stride_cb + (slot_safe % block_size) * stride_cs + kv_head * stride_ch
    cache_ty: tl.constexpr = k_cache_ptr.dtype.element_ty
    if cache_ty.primitive_bitwidth != 8:
        tl.store(k_cache_ptr + row + offs_d, k.to(cache_ty), mask=mask)
        tl.store(v_cache_ptr + row + offs_d, v.to(cache_ty), mask=mask)
    else:
        # QMAX, mantissa bits and smallest normal exponent of the storage format.
        qmax: tl.constexpr = 127.0 if cache_ty == tl.int8 else (57344.0 if cache_ty == tl.float8e5 else 448.0)
        mant: tl.constexpr = 2 if cache_ty == tl.float8e5 else 3
        emin: tl.constexpr = -14 if cache_ty == tl.float8e5 else -6
        for plane in tl.static_range(2):
            if plane == 0:
                x = k.to(tl.float32)
                cache = k_cache_ptr
            else:
                x = v.to(tl.float32)
                cache = v_cache_ptr
            amax = tl.max(tl.abs(x), 0)  # masked lanes hold 0.0
            scale = tl.math.div_rn(amax, qmax)
            scale = tl.minimum(tl.maximum(scale, 5.960464477539063e-08), 65504.0).to(tl.float16)
            q = tl.math.div_rn(x, scale.to(tl.float32))
            q = tl.minimum(tl.maximum(q, -qmax), qmax)
            if cache_ty == tl.int8:
                t = q
            else:
                # The fp8 grid step around |q|: 2**(exponent - mantissa bits), subnormal below 2**emin.
                bits = q.to(tl.int32, bitcast=True)
                e = tl.maximum(((bits >> 23) & 0xFF) - 127, emin) - mant
                ulp = ((e + 127) << 23).to(tl.float32, bitcast=True)
                t = tl.abs(q) * ((127 - e) << 23).to(tl.float32, bitcast=True)  # exact: a power-of-two scaling
            # Round t to the nearest integer, ties to even (t is exact, |t| <= 127, so t - floor(t) is exact too).
            f = tl.floor(t)
            d = t - f
            odd = (f.to(tl.int32) & 1) == 1
            r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
            if cache_ty == tl.int8:
                stored = r.to(tl.int8)
            else:
                # Back on the grid with q's sign bit (a negative value rounding to zero stays -0.0, as torch's cast).
                r_bits = (r * ulp).to(tl.int32, bitcast=True) | (bits & -2147483648)
                stored = r_bits.to(tl.float32, bitcast=True).to(cache_ty)
            tl.store(cache + row + offs_d, stored, mask=mask)
            scale_ptr = (cache + row + head_size).to(tl.pointer_type(tl.float16))
            tl.store(scale_ptr, scale, mask=slot >= 0)


def copy_blocks_kernel(
    cache_ptr,  # one layer's cache viewed as [2, num_blocks, block_numel] (contiguous)
    pairs_ptr,  # int64 [N, 2] (source, destination) block ids; pairs are independent
    block_numel,
    stride_plane,
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    plane = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2).to(tl.int64)
    src = tl.load(pairs_ptr + pair * 2)
    dst = tl.load(pairs_ptr + pair * 2 + 1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < block_numel
    base = cache_ptr + plane * stride_plane
    data = tl.load(base + src * block_numel + offs, mask=mask)
    tl.store(base + dst * block_numel + offs, data, mask=mask)
