"""A pure-torch model of what FlashInfer's paged wrappers compute (their semantics, not their speed).

The model takes exactly the arrays FlashInfer's ``plan``/``run`` take, so a test can feed it what the backend
hands FlashInfer and compare with the reference backend on a CPU. Each convention, and where it was read
(flashinfer-python 0.6.18 wheel: its Python sources and the CUDA headers it ships under ``data/include``):

* Cache: the pair ``(k_cache, v_cache)``, each ``[pages, page_size, kv_heads, head_dim]`` for
  ``kv_layout="NHD"`` (``flashinfer/decode.py`` ``BatchDecodeWithPagedKVCacheWrapper.run`` docstring,
  ``flashinfer/utils.py`` ``_unpack_paged_kv_cache``).
* A row's length: 0 if it has no pages, else ``(pages - 1) * page_size + last_page_len``
  (``include/flashinfer/page.cuh`` ``paged_kv_t::get_length``); token ``t`` is at
  ``page = kv_indices[kv_indptr[b] + t // page_size]``, offset ``t % page_size``
  (``paged_kv_t::protective_get_kv_offset``). ``kv_indptr`` values are absolute offsets into ``kv_indices``.
* GQA: query head ``h`` reads KV head ``h // (num_qo_heads // num_kv_heads)``
  (``include/flashinfer/attention/decode.cuh`` ``BatchDecodeWithPagedKVCacheDevice``:
  ``qo_head_idx = kv_head_idx * bdy + ty`` with ``bdy`` the group size).
* Scale and soft cap: without a cap the logit is ``sm_scale * q.k``; with cap ``c`` it is
  ``c * tanh(sm_scale * q.k / c)`` (``include/flashinfer/attention/variants.cuh`` ``DefaultAttention``:
  ``tanh(logits * sm_scale / c)`` in ``LogitsTransform``, then ``c * log2(e)`` as the softmax scale).
  ``sm_scale`` defaults to ``1 / sqrt(head_dim)`` (``plan`` docstring).
* Causal mask, bottom-right aligned: query ``i`` of ``qo_len`` sees key ``j`` of ``kv_len`` iff
  ``j + qo_len <= kv_len + i`` (``include/flashinfer/attention/prefill.cuh`` ``logits_mask``:
  masked when ``kv_idx + qo_len > kv_len + q_idx``).
* Sliding window: visible iff ``j + qo_len + window_left >= kv_len + i``; ``window_left = -1`` disables it
  (``variants.cuh`` ``DefaultAttention::LogitsMask``).
* Decode: one query per row at the row's last position, so no causal mask (``decode.cuh`` ``compute_qk`` applies
  only the variant's mask, with ``qo_idx = 0``; ``attention/default_decode_params.cuh`` ``get_qo_len`` is 1).
* A decode row without keys (graph padding) gets a zero output: the scheduler still gives it one work item
  (``attention/scheduler.cuh`` ``DecodeSplitKVIndptr``: ``max(pages, 1)``), which loads nothing and writes its
  initial state (``attention/state.cuh`` ``state_t::init``: ``o = 0``, ``d = 1``, then ``o / d``).
* Output dtype: the query's (``o_data_type`` defaults to ``q_data_type`` in ``plan``).

Assumed rather than read: that the tensor-core decode path (``use_tensor_cores=True``, built on the prefill
kernels) and FA3's paged prefill (``backend="auto"`` on sm_90) compute the same as the FA2 kernels read above;
that a prefill query seeing no key also gets zero (the contract never asks for one).
"""

from __future__ import annotations

import torch


def batch_prefill_with_paged_kv_cache(
    q: torch.Tensor,
    paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """What ``BatchPrefillWithPagedKVCacheWrapper.plan(...)`` then ``.run(q, paged_kv_cache)`` returns.

    ``q`` is ``[qo_indptr[-1], num_qo_heads, head_dim]``; returns the same shape in ``q.dtype``.
    """
    out = torch.zeros_like(q)
    qo = qo_indptr.tolist()
    for b in range(len(qo) - 1):
        keys, values = _row_kv(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        out[qo[b] : qo[b + 1]] = _attend(
            q[qo[b] : qo[b + 1]], keys, values, causal, sm_scale, window_left, logits_soft_cap
        )
    return out


def batch_decode_with_paged_kv_cache(
    q: torch.Tensor,
    paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    *,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """What ``BatchDecodeWithPagedKVCacheWrapper.plan(...)`` then ``.run(q, paged_kv_cache)`` returns.

    ``q`` is ``[batch_size, num_qo_heads, head_dim]`` (one query per row, at the row's last position).
    """
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        keys, values = _row_kv(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        out[b : b + 1] = _attend(q[b : b + 1], keys, values, False, sm_scale, window_left, logits_soft_cap)
    return out


def _row_kv(
    paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    b: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``b``'s keys and values ``[kv_len, kv_heads, head_dim]``, in token order."""
    k_cache, v_cache = paged_kv_cache
    page_size, kv_heads, head_dim = k_cache.shape[1:]
    start, end = int(kv_indptr[b]), int(kv_indptr[b + 1])
    kv_len = 0 if end == start else (end - start - 1) * page_size + int(kv_last_page_len[b])
    pages = kv_indices[start:end].to(device=k_cache.device, dtype=torch.int64)
    keys = k_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len]
    values = v_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len]
    return keys, values


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    logits_soft_cap: float | None,
) -> torch.Tensor:
    """One row: ``q`` ``[qo_len, Hq, D]`` over ``keys``/``values`` ``[kv_len, Hkv, D]``, in fp32."""
    qo_len, kv_len = q.shape[0], keys.shape[0]
    if kv_len == 0:
        return torch.zeros_like(q)
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), k)
    if logits_soft_cap:  # None or 0.0: off
        logits = logits_soft_cap * torch.tanh(logits * (scale / logits_soft_cap))
    else:
        logits = logits * scale
    i = torch.arange(qo_len, device=q.device).unsqueeze(1)
    j = torch.arange(kv_len, device=q.device).unsqueeze(0)
    visible = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j + qo_len <= kv_len + i
    if window_left >= 0:
        visible &= j + qo_len + window_left >= kv_len + i
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    probs = torch.where(visible.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
