"""A pure-torch model of what flash-attn 2's paged calls compute (their semantics, not their speed).

The functions take the keyword arguments of ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` that
the backend passes, so a test can feed a :class:`~paged_backend_cuda.flash_attn_plan.FlashAttnPlan` to both.
Each convention, and where it was read (Dao-AILab/flash-attention tag v2.8.3):

* Paged caches ``[num_blocks, page_block_size, kv_heads, head_dim]``; key ``t`` of row ``b`` is at block
  ``block_table[b, t // page_block_size]``, offset ``t % page_block_size`` (``flash_attn/flash_attn_interface.py``
  ``flash_attn_with_kvcache`` docstring; ``csrc/flash_attn/src/flash_fwd_kernel.h``
  ``compute_attn_1rowblock_splitkv``, the kernel every paged call runs: ``flash_api.cpp`` ``run_mha_fwd(...,
  force_split_kernel)``).
* Lengths: varlen row ``b`` has ``cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` queries and
  ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` keys; with the kv-cache call, ``cache_seqlens[b]`` keys
  (``csrc/flash_attn/src/block_info.h`` ``BlockInfo``).
* GQA: query head ``h`` reads KV head ``h // (heads / kv_heads)`` (``flash_attn_varlen_func`` docstring;
  ``bidh / params.h_h_k_ratio`` in the kernel).
* Soft cap ``c > 0``: logit ``c * tanh(softmax_scale * q.k / c)`` (``csrc/flash_attn/flash_api.cpp``
  ``set_params_fprop``: ``params.softcap = softmax_scale / softcap``, softmax scale ``softcap``;
  ``src/utils.h`` ``apply_softcap``: ``tanh(x * softcap)``); ``softmax_scale`` defaults to ``head_dim ** -0.5``.
* Masks (``src/mask.h`` ``apply_mask_local``, per row with ``Sq``/``Sk`` its own lengths): query ``i`` sees key
  ``j`` iff ``j <= i + Sk - Sq + right`` and, with a left bound, ``j >= i + Sk - Sq - left``; before that,
  the host normalises the flags (``flash_api.cpp`` ``mha_varlen_fwd``/``mha_fwd_kvcache``, then
  ``set_params_fprop``): a query length of 1 (``max_seqlen_q`` for varlen) turns ``causal`` off; ``causal``
  sets ``right = 0``; a bound ``>= max_seqlen_k`` (varlen) or ``>= max_blocks * page_block_size`` (kv-cache)
  becomes ``-1``; one negative bound beside a non-negative one becomes that maximum.
* A query that sees no key gets a zero output (``flash_attn_varlen_func`` docstring; ``flash_fwd_kernel.h``
  writes 0 when ``n_block_max <= n_block_min``); query rows after ``cu_seqlens_q[-1]`` are left untouched
  there (``torch::empty_like``) and zero here.

The kernels silently rely on ``max_seqlen_q``/``max_seqlen_k`` bounding every row (the grid covers
``max_seqlen_q`` queries; ``compute_attn_1rowblock_splitkv`` shares ``ceil(max_seqlen_k / kBlockN)`` key blocks
among the splits, so keys past the bound are never read); the model checks it, so a plan with a too-small
bound fails here instead of computing garbage on a GPU.
"""

from __future__ import annotations

import torch


def varlen_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """What ``flash_attn_varlen_func(q, k_cache, v_cache, ..., block_table=)`` returns: ``[total_q, H, D]``."""
    q_bounds = cu_seqlens_q.tolist()
    k_bounds = cu_seqlens_k.tolist()
    is_causal = causal and max_seqlen_q != 1
    left, right = _normalise_window(window_size, is_causal, max_seqlen_k)
    out = torch.zeros_like(q)
    for b in range(len(q_bounds) - 1):
        sq, sk = q_bounds[b + 1] - q_bounds[b], k_bounds[b + 1] - k_bounds[b]
        if sq > max_seqlen_q or sk > max_seqlen_k:
            raise ValueError(f"row {b}: {sq} queries / {sk} keys exceed max_seqlen_q/k = {max_seqlen_q}/{max_seqlen_k}")
        if sq == 0:
            continue
        keys, values = _row_kv(k_cache, v_cache, block_table[b], sk)
        out[q_bounds[b] : q_bounds[b + 1]] = _attend(
            q[q_bounds[b] : q_bounds[b + 1]], keys, values, left, right, softmax_scale, softcap
        )
    return out


def kvcache_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """What ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, block_table=, ...)`` returns.

    ``q`` is ``[batch, seqlen_q, H, D]`` (no new keys are appended); returns the same shape.
    """
    seqlen_q = q.shape[1]
    seqlen_k = block_table.shape[1] * k_cache.shape[1]  # the kv-cache call's static bound
    left, right = _normalise_window(window_size, causal and seqlen_q != 1, seqlen_k)
    out = torch.zeros_like(q)
    for b, sk in enumerate(cache_seqlens.tolist()):
        keys, values = _row_kv(k_cache, v_cache, block_table[b], sk)
        out[b] = _attend(q[b], keys, values, left, right, softmax_scale, softcap)
    return out


def _normalise_window(window_size: tuple[int, int], is_causal: bool, max_seqlen_k: int) -> tuple[int, int]:
    """The host-side rewriting of ``(left, right)`` in ``flash_api.cpp``; ``(-1, -1)`` means no mask at all."""
    left, right = window_size
    if is_causal:
        right = 0
    left = -1 if left >= max_seqlen_k else left
    right = -1 if right >= max_seqlen_k else right
    if left < 0 and right >= 0:
        left = max_seqlen_k
    if left >= 0 and right < 0:
        right = max_seqlen_k
    return left, right


def _row_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, table_row: torch.Tensor, seqlen_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seqlen_k`` keys and values of a row, ``[seqlen_k, kv_heads, head_dim]``."""
    page, kv_heads, head_dim = k_cache.shape[1:]
    blocks = table_row[: -(-seqlen_k // page)].to(device=k_cache.device, dtype=torch.int64)
    keys = k_cache[blocks].reshape(-1, kv_heads, head_dim)[:seqlen_k]
    values = v_cache[blocks].reshape(-1, kv_heads, head_dim)[:seqlen_k]
    return keys, values


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    left: int,
    right: int,
    softmax_scale: float | None,
    softcap: float,
) -> torch.Tensor:
    """One row: ``q`` ``[Sq, H, D]`` over ``[Sk, Hkv, D]`` with the normalised window, in fp32."""
    sq, sk = q.shape[0], keys.shape[0]
    if sk == 0:
        return torch.zeros_like(q)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), k)
    logits = softcap * torch.tanh(logits * (scale / softcap)) if softcap > 0 else logits * scale
    diagonal = torch.arange(sq, device=q.device).unsqueeze(1) + sk - sq  # each query's own position
    j = torch.arange(sk, device=q.device).unsqueeze(0)
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0 or right >= 0:
        visible = (j <= diagonal + right) & (j >= diagonal - left)
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    probs = torch.where(visible.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
