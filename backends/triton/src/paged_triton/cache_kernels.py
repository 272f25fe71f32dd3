# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so the kernel parameters stay unannotated.)
"""Triton source of the KV-cache kernels: store new keys/values at their slots, and copy whole blocks.

Undecorated for the same reason as :mod:`paged_triton.attention_kernels`.
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
    dst = (slot_safe // block_size) * stride_cb + (slot_safe % block_size) * stride_cs + kv_head * stride_ch + offs_d
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


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
