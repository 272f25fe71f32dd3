# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so the kernel parameters stay unannotated.)
"""Triton source of paged attention: one tiled kernel for decode and prefill rows, plus the split-K reduction.

These functions carry no ``@triton.jit`` decorator on purpose: :mod:`paged_triton.launch` wraps the
same source either as a compiled ``JITFunction`` (GPUs, ahead-of-time checks) or as the Triton
interpreter's ``InterpretedFunction`` (CPU tensors), so one process can hold both and no environment
variable has to be set before import.

Tiling. A program owns ``BLOCK_M`` query rows of one KV head: ``BLOCK_M // group`` consecutive tokens of
one sequence times the ``group`` query heads that share that KV head (GQA), so each key/value tile is
loaded once per group. Decode rows use ``BLOCK_M = 16`` (one token, the rest masked) and may split their
context into partitions (flash-decoding); prefill rows use larger tiles over their new tokens and attend to
the cached context plus the causal part of the new tokens.

Sliding windows and soft caps are compiled in only when used (``WINDOW``, ``SOFT_CAP``: the runtime branches
cost registers that spilled on RDNA and SGPRs on CDNA, ahead-of-time report), their sizes are runtime
arguments. A windowed tile's key loop starts at the ``BLOCK_N`` tile holding the first key its first row
sees: block-table entries of blocks wholly before the window may be the null block or stale ids, so they are
never read (and keys before the window inside that first tile are masked out of the loads too). The soft cap
``c * tanh(s / c)`` applies to the scaled score, before masking and softmax.

Quantized caches (int8, fp8; :mod:`paged_core.contract.kv_quant`'s default layout) are recognised by the
cache's 8-bit element type: each stored vector has ``head_size + 2`` elements, the last two holding its
float16 scale. The stored values convert exactly to the query dtype (int8 and both fp8 formats fit in
bf16/fp16/fp32), and the per-key scales are applied where they cost one multiply per score instead of one
per element: each key's scale to its column of ``q . k`` (in fp32), each value's scale to its column of the
probabilities before the ``p . v`` dot, sums in fp32. (Dequantizing whole tiles first spilled registers on
every AMD target, ahead-of-time report.) The result differs from attention over the dequantized cache only
by where the roundings fall: the keys are exact, and ``p * scale`` is rounded once instead of ``p`` and
``v * scale``.

``DOT_FP32`` widens the dot operands to fp32 with IEEE precision. It is always on for fp32 queries (so
they never drop to tf32/xf32), and on for bf16 only under the Triton interpreter, whose ``tl.dot``
multiplies raw bf16 bits (triton 3.9): bf16 products are exact in fp32, so the result is the same math
with another summation order; the compiled bf16 path (native dot) is what the ahead-of-time check builds.
"""

from __future__ import annotations

import triton.language as tl


def paged_attention_kernel(
    out_ptr,  # contiguous [T, H, HEAD] in the query dtype (written when not SPLIT)
    part_acc_ptr,  # [Td, H, MAX_SPLITS, HEAD_PAD] fp32 unnormalised partial outputs (SPLIT only)
    part_ml_ptr,  # [Td, H, MAX_SPLITS, 2] fp32 running max and sum per partition (SPLIT only)
    q_ptr,
    k_cache_ptr,  # contiguous [num_blocks, block_size, kv_heads, HEAD] (the key plane of the cache)
    v_cache_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    row_offset,  # first batch row handled by this launch (decode rows come first)
    scale,
    soft_cap,  # logits soft cap c (read only when SOFT_CAP)
    window,  # sliding window in keys, the query's own included (read only when WINDOW)
    group,  # query heads per KV head (<= BLOCK_M)
    head_size,
    block_size,
    partition,  # keys per split (a multiple of BLOCK_N); ignored unless SPLIT
    num_splits,
    stride_qt,
    stride_qh,  # the last query dim is contiguous (the launcher guarantees it)
    stride_bt,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    D_CHUNK: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFT_CAP: tl.constexpr,
):
    row = tl.program_id(0) + row_offset
    tile = tl.program_id(1) // num_splits
    split = tl.program_id(1) % num_splits
    kv_head = tl.program_id(2)
    # An 8-bit cache is a quantized one: each vector carries its float16 scale as two more elements.
    quant: tl.constexpr = k_cache_ptr.dtype.element_ty.primitive_bitwidth == 8
    # int8 converts through fp32 (exact either way): the Triton 3.9 interpreter turns int8 -> bf16 into garbage.
    via_fp32: tl.constexpr = k_cache_ptr.dtype.element_ty == tl.int8
    entry = head_size
    if quant:
        entry = head_size + 2
    # The value weights p * scale (scale ~ max|v| / QMAX) would sink into fp16's subnormals (e5m2's QMAX is
    # 57344): they are carried times a power of two near QMAX and the sums scaled back once at the end (exact).
    v_gain: tl.constexpr = (
        128.0
        if k_cache_ptr.dtype.element_ty == tl.int8
        else 32768.0
        if k_cache_ptr.dtype.element_ty == tl.float8e5
        else 256.0
    )
    # Output and cache are contiguous, so their strides follow from the sizes: fewer kernel arguments
    # keeps scalar-register pressure (SGPRs on AMD) under the limit.
    stride_oh = head_size
    stride_ot = tl.num_programs(2) * group * head_size
    stride_ch = entry
    stride_cs = tl.num_programs(2) * entry
    stride_cb = block_size * stride_cs

    q_start = tl.load(query_start_loc_ptr + row)
    q_len = tl.load(query_start_loc_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    context = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    tokens_per_tile = BLOCK_M // group
    tok = tile * tokens_per_tile + offs_m // group
    head = kv_head * group + offs_m % group
    row_ok = (offs_m < tokens_per_tile * group) & (tok < q_len)
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < head_size
    # Per-row offsets as int32 vectors (2-D int64 offsets would double their register cost).
    q_rows = (q_start + tok) * stride_qt + head * stride_qh
    q_mask = row_ok[:, None] & d_ok[None, :]
    if D_CHUNK == HEAD_PAD:
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
    pos = context + tok  # absolute position of each query row

    # Keys this program visits: from the first key its first row sees (its window's start, aligned down to a
    # key tile, which stays inside that key's paged block), cut at the last visible position of the tile
    # (causal); a split takes its partition of that range.
    first_tok = tile * tokens_per_tile
    last_tok = tl.minimum(first_tok + tokens_per_tile, q_len)
    # A tile past the row's last token (the grid covers the batch's longest query) visits no key.
    kv_hi = tl.where(first_tok < q_len, tl.minimum(seq_len, context + last_tok), 0)
    kv_lo = 0
    if WINDOW:
        win_lo = tl.maximum(context + first_tok - window + 1, 0)
        kv_lo = (win_lo // BLOCK_N) * BLOCK_N
        row_lo = pos - window  # each row sees keys in (row_lo, pos]
    if SPLIT:
        kv_lo = kv_lo + split * partition
        kv_hi = tl.minimum(kv_hi, kv_lo + partition)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp: fold log2(e) into the scale
    if SOFT_CAP:
        cap_log2 = soft_cap * 1.4426950408889634
        cap_k = -2.0 / soft_cap  # exp(-2|x|) = exp2(-2|x| log2(e)), with x = s / cap_log2
    table_row = block_table_ptr + row.to(tl.int64) * stride_bt
    for start in range(kv_lo, kv_hi, BLOCK_N):
        # BLOCK_N divides block_size, so one tile never straddles two paged blocks. The block's base is
        # a scalar int64 offset (caches can exceed 2**31 elements); offsets inside a block fit int32.
        block = tl.load(table_row + start // block_size).to(tl.int64)
        base = block * stride_cb + kv_head * stride_ch
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_hi
        if WINDOW:
            n_ok = n_ok & (offs_n >= win_lo)
        kv_rows = (offs_n % block_size) * stride_cs
        kv_offs = kv_rows[:, None] + offs_d[None, :]
        kv_mask = n_ok[:, None] & d_ok[None, :]
        v = tl.load(v_cache_ptr + base + kv_offs, mask=kv_mask, other=0.0)
        if quant:
            # Each key/value row's float16 scale sits right after its head_size elements (an even byte offset);
            # the stored values convert to the query dtype exactly.
            v_scale = tl.load(
                (v_cache_ptr + base + kv_rows + head_size).to(tl.pointer_type(tl.float16)), mask=n_ok, other=0.0
            )
            k_scale = tl.load(
                (k_cache_ptr + base + kv_rows + head_size).to(tl.pointer_type(tl.float16)), mask=n_ok, other=0.0
            )
        if via_fp32:
            v = v.to(tl.float32)
        v = v.to(q_ptr.dtype.element_ty)
        if D_CHUNK == HEAD_PAD:
            k = tl.load(k_cache_ptr + base + kv_offs, mask=kv_mask, other=0.0)
            if via_fp32:
                k = k.to(tl.float32)
            k = k.to(q_ptr.dtype.element_ty)
            if DOT_FP32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
        else:
            # Narrow dot operands (RDNA's WMMA holds a whole operand row per lane): q . k over head-dim
            # chunks, re-reading the query chunk from cache each time instead of keeping all of it live.
            s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for dc in tl.static_range(0, HEAD_PAD, D_CHUNK):
                offs_c = dc + tl.arange(0, D_CHUNK)
                # The loop-dependent term keeps the compiler from hoisting the query chunks (which would
                # make the whole query live in registers again).
                c_ok = (offs_c < head_size) & (offs_c * 0 + start >= kv_lo)
                qc = tl.load(q_ptr + q_rows[:, None] + offs_c[None, :], mask=row_ok[:, None] & c_ok[None, :], other=0.0)
                kc_offs = kv_rows[:, None] + offs_c[None, :]
                kc = tl.load(k_cache_ptr + base + kc_offs, mask=n_ok[:, None] & c_ok[None, :], other=0.0)
                if via_fp32:
                    kc = kc.to(tl.float32)
                kc = kc.to(q_ptr.dtype.element_ty)
                if DOT_FP32:
                    s += tl.dot(qc.to(tl.float32), tl.trans(kc.to(tl.float32)), input_precision="ieee")
                else:
                    s += tl.dot(qc, tl.trans(kc))
        if quant:
            s = s * k_scale.to(tl.float32)[None, :]  # q . (k * scale) = (q . k) * scale, per key
        s = s * qk_scale
        if SOFT_CAP:
            # c * tanh(x / c) in log2 units (c' = c * log2(e)), tanh from exp2 of -2|x| / c' (no overflow).
            e = tl.exp2(tl.abs(s) * cap_k)
            s = tl.where(s < 0.0, e - 1.0, 1.0 - e) / (1.0 + e) * cap_log2
        visible = (offs_n[None, :] <= pos[:, None]) & n_ok[None, :]
        if WINDOW:
            visible = visible & (offs_n[None, :] > row_lo[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        pw = p  # the weights of the values as stored: p * scale per key for a quantized cache
        if quant:
            pw = p * (v_scale.to(tl.float32) * v_gain)[None, :]
        if DOT_FP32:
            pv = pw.to(v.dtype).to(tl.float32)  # round p as the native path does, then multiply exactly
            acc = acc * alpha[:, None] + tl.dot(pv, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pw.to(v.dtype), v)
        m_i = m_new
    if quant:
        acc = acc * (1.0 / v_gain)

    if SPLIT:
        # Decode rows only: token index == q_start. Partials are combined by paged_attention_reduce_kernel.
        part = ((q_start + tok) * tl.num_programs(2) * group + head) * MAX_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_PAD + offs_d[None, :], acc, mask=row_ok[:, None])
        pair = tl.where(tl.arange(0, 2)[None, :] == 0, m_i[:, None], l_i[:, None])
        tl.store(part_ml_ptr + part[:, None] * 2 + tl.arange(0, 2)[None, :], pair, mask=row_ok[:, None])
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_rows = (q_start + tok) * stride_ot + head * stride_oh
        tl.store(
            out_ptr + o_rows[:, None] + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )


def paged_attention_reduce_kernel(
    out_ptr,  # [T, H, HEAD]
    part_acc_ptr,
    part_ml_ptr,
    num_splits,
    head_size,
    stride_ot,
    stride_oh,
    HEAD_PAD: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    base = (token * tl.num_programs(1) + head) * MAX_SPLITS
    offs_d = tl.arange(0, HEAD_PAD)
    # One pass over the partitions, rescaling as the running maximum grows (as in the main kernel):
    # one vector of HEAD_PAD live at a time keeps registers (and AMD's scalar registers) low.
    m_run = float("-inf")
    l_run = 0.0
    acc = tl.zeros([HEAD_PAD], dtype=tl.float32)
    for s in range(0, num_splits):
        m = tl.load(part_ml_ptr + (base + s) * 2)
        lsum = tl.load(part_ml_ptr + (base + s) * 2 + 1)
        m_new = tl.maximum(m_run, m)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # partitions past the sequence: m = -inf
        alpha = tl.exp2(m_run - m_safe)
        w = tl.exp2(m - m_safe)
        acc = acc * alpha + tl.load(part_acc_ptr + (base + s) * HEAD_PAD + offs_d) * w
        l_run = l_run * alpha + lsum * w
        m_run = m_new
    out = acc / tl.where(l_run > 0.0, l_run, 1.0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < head_size,
    )
