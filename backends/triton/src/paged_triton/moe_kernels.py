# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so the kernel parameters stay unannotated.)
"""Triton source of routed experts (:meth:`paged_core.api.FusedOps.experts`): a grouped GEMM over sorted pairs.

Undecorated, as :mod:`paged_triton.lora_kernels` (:mod:`paged_triton.moe_launch` wraps them and plans the rows).

The launcher sorts the ``T * k`` (token, slot) pairs by expert on the device and lays them out in blocks of
``BLOCK_M`` rows, each block holding one expert's pairs only (an expert's last block padded with ``-1``), with
``block_experts`` naming each block's expert (``E`` for the blocks past the end of the plan, which return at
once: the grid is an upper bound computed from shapes). Two kernels run over those blocks:

- :func:`moe_gate_up_kernel`: one program per block and block of ``BLOCK_N`` intermediate columns; the block's
  tokens times the expert's gate rows and up rows (two ``tl.dot`` sums), then ``act(gate) * up`` stored in
  fp32 at the block's rows of the intermediate (``[blocks * BLOCK_M, I]``);
- :func:`moe_down_kernel`: one program per block and block of ``BLOCK_N`` hidden columns; the intermediate
  rows times the expert's down rows, stored in fp32 at each pair's own row of ``[T * k, H]``.

Each output element is one row times one column with the reduction in ``BLOCK_K`` steps: tile sizes fixed by
the layer (never by the token count) keep a token's bits independent of the other tokens in the call. Every
sum is fp32. ``DOT_FP32`` widens both operands to fp32 with IEEE precision (never tf32): for fp32, for mixed
dtypes and under the interpreter (whose ``tl.dot`` multiplies raw bf16 bits, see
:mod:`paged_triton.attention_kernels`); the down product always runs on the fp32 intermediate, as the
contract's reference does (one rounding, at the end).
"""

from __future__ import annotations

import triton.language as tl


def moe_gate_up_kernel(
    inter_ptr,  # [blocks * BLOCK_M, I] fp32, contiguous: act(gate) * up per planned row
    x_ptr,  # [T, H], unit stride along H
    w_ptr,  # [E, 2I, H], unit stride along H (gate rows 0 .. I-1, up rows I .. 2I-1)
    rows_ptr,  # [blocks * BLOCK_M] int64: the pair (token * k + slot) of each planned row, -1 for padding
    block_experts_ptr,  # [blocks] int64: each block's expert, num_experts past the plan's end
    num_experts,
    top_k,
    hidden,
    inter,
    stride_xt,
    stride_we,
    stride_wn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
    GELU_TANH: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= num_experts:
        return
    offs_m = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(rows_ptr + offs_m)
    m_mask = pairs >= 0
    tokens = tl.where(m_mask, pairs, 0) // top_k
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    gate_at = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn
    up_at = gate_at + inter * stride_wn
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < hidden
        x = tl.load(
            x_ptr + tokens[:, None] * stride_xt + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        w_mask = n_mask[:, None] & k_mask[None, :]
        gate = tl.load(gate_at + offs_k[None, :], mask=w_mask, other=0.0)
        up = tl.load(up_at + offs_k[None, :], mask=w_mask, other=0.0)
        if DOT_FP32:
            xf = x.to(tl.float32)
            acc_gate += tl.dot(xf, tl.trans(gate.to(tl.float32)), input_precision="ieee")
            acc_up += tl.dot(xf, tl.trans(up.to(tl.float32)), input_precision="ieee")
        else:
            acc_gate += tl.dot(x, tl.trans(gate))
            acc_up += tl.dot(x, tl.trans(up))
    if GELU_TANH:
        # GELU's tanh form: 0.5 g (1 + tanh(z)) = g * sigmoid(2 z), z = sqrt(2 / pi) (g + 0.044715 g^3); no tanh
        # needed, and no overflow (the sigmoid of a large negative argument is 0).
        act = tl.sigmoid(1.5957691216057308 * (acc_gate + 0.044715 * acc_gate * acc_gate * acc_gate))
    else:
        act = tl.sigmoid(acc_gate)
    out = acc_gate * act * acc_up
    tl.store(inter_ptr + offs_m[:, None] * inter + offs_n[None, :], out, mask=m_mask[:, None] & n_mask[None, :])


def moe_down_kernel(
    out_ptr,  # [T * k, H] fp32, contiguous: each pair's expert output
    inter_ptr,  # [blocks * BLOCK_M, I] fp32, contiguous
    w_ptr,  # [E, H, I], unit stride along I
    rows_ptr,
    block_experts_ptr,
    num_experts,
    hidden,
    inter,
    stride_we,
    stride_wn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= num_experts:
        return
    offs_m = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(rows_ptr + offs_m)
    m_mask = pairs >= 0
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    w_at = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < inter
        h = tl.load(
            inter_ptr + offs_m[:, None] * inter + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        w = tl.load(w_at + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.dot(h, tl.trans(w.to(tl.float32)), input_precision="ieee")
    out_at = out_ptr + tl.where(m_mask, pairs, 0)[:, None] * hidden + offs_n[None, :]
    tl.store(out_at, acc, mask=m_mask[:, None] & n_mask[None, :])
