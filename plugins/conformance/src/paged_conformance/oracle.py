"""The expected outputs: the ``reference`` backend, or a dense per-row computation.

The suite compares against the ``reference`` backend. When the backend under
test *is* the reference (or the reference cannot be imported) comparing it
with itself would prove nothing, so a dense oracle is used instead: plain
attention over each row's contiguous keys, with no paging at all.
"""

from __future__ import annotations

import dataclasses

import torch

from paged_conformance.batch import Batch
from paged_core.api import AttentionBackend, AttentionSpec, dequantize_kv, is_quantized_kv, quantize_kv


def stored_values(batch: Batch) -> Batch:
    """``batch`` with the keys and values its KV cache holds: for a quantized cache (int8, fp8) each vector
    quantized and read back by the contract's rule (:func:`~paged_core.api.quantize_kv`, in float32); else as is."""
    if not is_quantized_kv(batch.kv_dtype):
        return batch

    def read(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [dequantize_kv(quantize_kv(t, batch.kv_dtype)) for t in ts]

    return dataclasses.replace(batch, keys=read(batch.keys), values=read(batch.values))


def dense_attention(batch: Batch, spec: AttentionSpec | None = None) -> torch.Tensor:
    """Attention of every query token over its row's keys, in float32, ``[T, num_heads, head_size]``.

    The keys and values are those the batch's KV cache holds (:func:`stored_values`). Query head ``h`` reads
    KV head ``h // gqa_ratio``; key ``j`` is visible from position ``i`` iff ``j <= i`` and, with a window
    ``w``, ``i - w < j``.
    """
    spec = spec or batch.spec
    batch = stored_values(batch)
    outs = []
    for q, k, v, s in zip(batch.queries, batch.keys, batch.values, batch.seq_lens, strict=True):
        qf = q.float()
        kf = k.float().repeat_interleave(spec.gqa_ratio, dim=1)
        vf = v.float().repeat_interleave(spec.gqa_ratio, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qf, kf) * spec.softmax_scale
        if spec.logits_soft_cap is not None:
            cap = spec.logits_soft_cap
            scores = cap * torch.tanh(scores / cap)
        pos_q = torch.arange(s - q.shape[0], s)[:, None]
        pos_k = torch.arange(s)[None, :]
        visible = pos_k <= pos_q
        if spec.sliding_window is not None:
            visible &= pos_k > pos_q - spec.sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf))
    return torch.cat(outs)


def reference_backend_cls() -> type[AttentionBackend] | None:
    """The core's reference backend class, or None if this core has none."""
    try:
        from paged_core.reference.backend import ReferenceBackend
    except ImportError:
        return None
    return ReferenceBackend


def choose_oracle(backend_cls: type[AttentionBackend], requested: str) -> str:
    """Resolve ``--oracle auto|reference|dense`` for ``backend_cls``."""
    if requested not in ("auto", "reference", "dense"):
        raise ValueError(f"unknown oracle {requested!r} (known: auto, reference, dense)")
    ref = reference_backend_cls()
    if requested == "dense" or (requested == "auto" and (ref is None or issubclass(backend_cls, ref))):
        return "dense"
    if ref is None:
        raise ValueError("oracle 'reference' requested but paged_core.reference.backend is not importable")
    return "reference"
