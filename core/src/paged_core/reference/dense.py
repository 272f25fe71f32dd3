"""A dense (unpaged) attention oracle: the one place the masking rule is spelled out in code."""

from __future__ import annotations

import torch

from paged_core.contract.capabilities import AttentionSpec
from paged_core.errors import PagedError


def visibility_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Bool ``[Tq, Tk]``: key ``j`` is visible from query ``i`` iff ``i - window < j <= i``.

    Positions are absolute token positions in the sequence, so a chunked
    prefill (earlier tokens already cached) masks exactly like a full one.
    """
    qp = q_positions.reshape(-1, 1).to(torch.int64)
    kp = k_positions.reshape(1, -1).to(torch.int64)
    visible = kp <= qp
    if sliding_window is not None:
        visible = visible & (kp > qp - sliding_window)
    return visible


def dense_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: AttentionSpec,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """Causal attention of ``q`` ``[Tq, H, D]`` over ``k``/``v`` ``[Tk, H_kv, D]``.

    Computes in fp32: scores times ``spec.softmax_scale``, then the soft cap
    ``c * tanh(s / c)``, then the causal + sliding-window mask over the given
    absolute positions, softmax, and the weighted sum of values. Query head
    ``h`` reads KV head ``h // spec.gqa_ratio``. A query that sees no key at
    all gets a zero output (rather than NaN). Returns ``[Tq, H, D]`` in
    ``q.dtype``.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise PagedError(f"q, k, v must be 3-D [tokens, heads, head_size], got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if q.shape[1:] != (spec.num_heads, spec.head_size):
        raise PagedError(f"q has shape {tuple(q.shape)}, expected [T, {spec.num_heads}, {spec.head_size}]")
    kv_shape = (spec.num_kv_heads, spec.head_size)
    if k.shape[1:] != kv_shape or v.shape != k.shape:
        raise PagedError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [Tk, {spec.num_kv_heads}, {spec.head_size}]"
        )
    if q_positions.numel() != q.shape[0] or k_positions.numel() != k.shape[0]:
        raise PagedError(
            f"need one position per token: {q_positions.numel()} for {q.shape[0]} queries, "
            f"{k_positions.numel()} for {k.shape[0]} keys"
        )
    kf, vf = expand_kv(k, v, spec)
    visible = visibility_mask(q_positions.to(q.device), k_positions.to(q.device), spec.sliding_window)
    return attend(q, kf, vf, spec, visible)


def expand_kv(k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[Tk, H_kv, D]`` as new float32 ``[Tk, H, D]`` tensors: head ``h`` is KV head
    ``h // spec.gqa_ratio``."""
    kf = k.float().repeat_interleave(spec.gqa_ratio, dim=1)
    vf = v.float().repeat_interleave(spec.gqa_ratio, dim=1)
    return kf, vf


def attend(
    q: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, spec: AttentionSpec, visible: torch.Tensor | None = None
) -> torch.Tensor:
    """The arithmetic of :func:`dense_causal_attention` on expanded keys and values (:func:`expand_kv`).

    ``visible`` is the bool ``[Tq, Tk]`` mask (:func:`visibility_mask`); ``None`` means every key is
    visible to every query (no masking step at all). Returns ``[Tq, H, D]`` in ``q.dtype``.
    """
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * spec.softmax_scale
    if spec.logits_soft_cap is not None:
        cap = spec.logits_soft_cap
        scores = cap * torch.tanh(scores / cap)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if visible is not None:
        # A fully masked row softmaxes to NaN; define its output as zero instead.
        probs = torch.where(visible.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    out = torch.einsum("hqk,khd->qhd", probs, vf)
    return out.to(q.dtype)
