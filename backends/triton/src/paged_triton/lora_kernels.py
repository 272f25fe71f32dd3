# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so the kernel parameters stay unannotated.)
"""Triton source of the multi-LoRA pair (:meth:`paged_core.api.FusedOps.lora_shrink` / ``lora_expand``).

Undecorated, as :mod:`paged_triton.attention_kernels` (:mod:`paged_triton.lora_launch` wraps them).

Two forms of each product:

- **segmented** (prefill and large batches): the launcher sorts the token indices by slot on the device
  (``order``, ``sorted_slots``: a stable sort, no host read), and one program owns ``BLOCK_T`` consecutive
  sorted tokens and one block of outputs. Sorted, a block's tokens hold one adapter or a few neighbouring ones:
  the program loops over the slots from its first token's to its last one's (read on the device), multiplying
  only the rows of each slot (the others masked to zero) by that slot's weights with ``tl.dot``. Tokens without
  an adapter (slot -1) sort first and take no part.
- **per token** (decode, few tokens): one program per token and block of outputs, no sort; the products are
  broadcast multiply-and-sum over a block of the reduction (``tl.dot`` needs 16 rows).

Shrink's outputs are few (``T`` x ``R``), so few programs cover them: where that leaves a device's
multiprocessors idle the reduction over ``K`` is split between programs (``k_split`` inputs each, grid axis 2),
which add their partial sums into the zeroed output with ``tl.atomic_add`` (``ATOMIC``; the order of those adds,
and so the last bits, may differ between runs).

Every sum is fp32. ``DOT_FP32`` widens both dot operands to fp32 with IEEE precision (never tf32): always for
``lora_expand`` (the shrunk rows are fp32), for ``lora_shrink`` when ``x`` is fp32 or its dtype differs from the
adapters', and under the interpreter, whose ``tl.dot`` multiplies raw bf16 bits (see
:mod:`paged_triton.attention_kernels`). ``lora_expand`` adds to ``y`` in fp32 and rounds once. ``HALF_DOT``
(off; measured by ``benchmarks/lora_triton.py``) would instead round the shrunk rows to the adapters' 16-bit
dtype for a tensor-core dot, as punica's kernels do: a second rounding the contract does not make.
"""

from __future__ import annotations

import triton.language as tl


def lora_shrink_segmented_kernel(
    out_ptr,  # [T, R] fp32, contiguous
    x_ptr,  # [T, K], unit stride along K
    a_ptr,  # [S, R, K], unit stride along K
    order_ptr,  # [T] int64: token indices sorted by slot
    sorted_slots_ptr,  # [T] int64: their slots, ascending
    tokens,
    rank,
    in_features,
    stride_xt,
    stride_as,
    stride_ar,
    k_split,  # inputs per program along K (a multiple of BLOCK_K); program_id(2) picks its range
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    first = tl.program_id(0) * BLOCK_T
    offs_t = first + tl.arange(0, BLOCK_T)
    t_mask = offs_t < tokens
    rows = tl.load(order_ptr + offs_t, mask=t_mask, other=0)
    row_slots = tl.load(sorted_slots_ptr + offs_t, mask=t_mask, other=-1)
    lo = tl.maximum(tl.load(sorted_slots_ptr + first), 0)
    hi = tl.load(sorted_slots_ptr + tl.minimum(first + BLOCK_T, tokens) - 1)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = offs_r < rank
    k_begin = tl.program_id(2) * k_split
    k_end = tl.minimum(k_begin + k_split, in_features)
    acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
    for slot in range(lo, hi + 1):
        sel = t_mask & (row_slots == slot)
        for k0 in range(k_begin, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < in_features
            x = tl.load(
                x_ptr + rows[:, None] * stride_xt + offs_k[None, :], mask=sel[:, None] & k_mask[None, :], other=0.0
            )
            a = tl.load(
                a_ptr + slot * stride_as + offs_r[:, None] * stride_ar + offs_k[None, :],
                mask=r_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            if DOT_FP32:
                acc += tl.dot(x.to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(a))
    out_at = out_ptr + rows[:, None] * rank + offs_r[None, :]
    if ATOMIC:
        tl.atomic_add(out_at, acc, mask=t_mask[:, None] & r_mask[None, :])
    else:
        tl.store(out_at, acc, mask=t_mask[:, None] & r_mask[None, :])


def lora_expand_segmented_kernel(
    y_ptr,  # [T, N], unit stride along N; updated in place
    shrunk_ptr,  # [T, R] fp32, unit stride along R
    b_ptr,  # [S, N, R], unit stride along R
    order_ptr,
    sorted_slots_ptr,
    tokens,
    out_features,
    rank,
    stride_yt,
    stride_st,
    stride_bs,
    stride_bn,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    first = tl.program_id(0) * BLOCK_T
    offs_t = first + tl.arange(0, BLOCK_T)
    t_mask = offs_t < tokens
    rows = tl.load(order_ptr + offs_t, mask=t_mask, other=0)
    row_slots = tl.load(sorted_slots_ptr + offs_t, mask=t_mask, other=-1)
    lo = tl.maximum(tl.load(sorted_slots_ptr + first), 0)
    hi = tl.load(sorted_slots_ptr + tl.minimum(first + BLOCK_T, tokens) - 1)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < out_features
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for slot in range(lo, hi + 1):
        sel = t_mask & (row_slots == slot)
        for r0 in range(0, rank, BLOCK_R):
            offs_r = r0 + tl.arange(0, BLOCK_R)
            r_mask = offs_r < rank
            s = tl.load(
                shrunk_ptr + rows[:, None] * stride_st + offs_r[None, :], mask=sel[:, None] & r_mask[None, :], other=0.0
            )
            b = tl.load(
                b_ptr + slot * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
                mask=n_mask[:, None] & r_mask[None, :],
                other=0.0,
            )
            if HALF_DOT:
                acc += tl.dot(s.to(b.dtype), tl.trans(b))
            else:
                acc += tl.dot(s, tl.trans(b.to(tl.float32)), input_precision="ieee")
    update = (t_mask & (row_slots >= 0))[:, None] & n_mask[None, :]
    y_at = y_ptr + rows[:, None] * stride_yt + offs_n[None, :]
    y = tl.load(y_at, mask=update, other=0.0)
    tl.store(y_at, (y.to(tl.float32) + acc).to(y.dtype), mask=update)


def lora_shrink_token_kernel(
    out_ptr,  # [T, R] fp32, contiguous
    x_ptr,
    a_ptr,
    slots_ptr,  # [T] int64
    rank,
    in_features,
    stride_xt,
    stride_as,
    stride_ar,
    k_split,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token)
    # A token without an adapter reads nothing (every load masked off) and stores zeros.
    k_limit = tl.where(slot >= 0, in_features, 0)
    slot = tl.maximum(slot, 0)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = offs_r < rank
    k_begin = tl.program_id(2) * k_split
    k_end = tl.minimum(k_begin + k_split, in_features)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_limit
        x = tl.load(x_ptr + token * stride_xt + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        a = tl.load(
            a_ptr + slot * stride_as + offs_r[:, None] * stride_ar + offs_k[None, :],
            mask=r_mask[:, None] & k_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    if ATOMIC:
        tl.atomic_add(out_ptr + token * rank + offs_r, acc, mask=r_mask)
    else:
        tl.store(out_ptr + token * rank + offs_r, acc, mask=r_mask)


def lora_expand_token_kernel(
    y_ptr,
    shrunk_ptr,
    b_ptr,
    slots_ptr,
    out_features,
    rank,
    stride_yt,
    stride_st,
    stride_bs,
    stride_bn,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token)
    # A token without an adapter reads and writes nothing.
    n_limit = tl.where(slot >= 0, out_features, 0)
    slot = tl.maximum(slot, 0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < n_limit
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        r_mask = offs_r < rank
        s = tl.load(shrunk_ptr + token * stride_st + offs_r, mask=r_mask, other=0.0)
        b = tl.load(
            b_ptr + slot * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
            mask=n_mask[:, None] & r_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(b * s[None, :], axis=1)
    y_at = y_ptr + token * stride_yt + offs_n
    y = tl.load(y_at, mask=n_mask, other=0.0)
    tl.store(y_at, (y.to(tl.float32) + acc).to(y.dtype), mask=n_mask)
