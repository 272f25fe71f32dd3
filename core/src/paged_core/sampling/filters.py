"""Top-k, top-p and min-p as one per-row probability threshold, without sorting the vocabulary.

A full sort of a [rows, 49152] batch costs hundreds of milliseconds on a CPU.
The top-p cut only needs the head of the sorted distribution, so the head is
taken with ``topk`` on growing candidate counts, and only rows whose nucleus is
wider than every candidate count fall back to a full sort. The threshold found
is the same either way: the head values and their running sums do not depend
on how many candidates were taken.
"""

from __future__ import annotations

import torch

# Candidate counts tried in turn before a full sort (the first grows to cover any top-k).
CANDIDATE_COUNTS = (64, 1024)


def keep_threshold(
    probs: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None, min_p: torch.Tensor | None
) -> torch.Tensor:
    """Per-row threshold: a token survives top-k, then top-p, then min-p iff its probability is >= it.

    ``probs`` is fp32 [R, V] (a softmax, after temperature); ``top_k`` int64
    [R] (>= V is off); ``top_p`` fp32 [R] (1.0 is off): the smallest set of
    most likely tokens whose mass, renormalised within the top-k set, reaches
    ``p``; ``min_p`` fp32 [R]: ``min_p * max(prob)``. Tokens tied with the
    threshold are kept.
    """
    threshold = torch.zeros(probs.shape[0], dtype=probs.dtype, device=probs.device)
    if top_k is not None or top_p is not None:
        threshold = _head_threshold(probs, top_k, top_p)
    if min_p is not None:
        threshold = torch.maximum(threshold, probs.amax(dim=-1) * min_p.to(probs.dtype))
    return threshold


def _head_threshold(probs: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    rows, vocab = probs.shape
    device = probs.device
    k = torch.full((rows,), vocab, device=device) if top_k is None else top_k.clamp(1, vocab)
    p = torch.ones(rows, device=device) if top_p is None else top_p.to(probs.dtype)
    threshold = torch.zeros(rows, dtype=probs.dtype, device=device)
    pending = torch.nonzero((k < vocab) | (p < 1.0)).flatten()
    active_k = k[k < vocab]
    # The first candidate count covers every top-k row, so only top-p-only rows can need more.
    first = max(CANDIDATE_COUNTS[0], int(active_k.max()) if active_k.numel() else 0)
    sizes = sorted({min(s, vocab) for s in (first, *CANDIDATE_COUNTS[1:], vocab) if s >= first})
    for size in sizes:
        if pending.numel() == 0:
            break
        whole = pending.numel() == rows
        sub, kk, pp = (probs, k, p) if whole else (probs[pending], k[pending], p[pending])
        head = sub.topk(size, dim=-1).values if size < vocab else sub.sort(dim=-1, descending=True).values
        running = head.cumsum(dim=-1)
        last_k = (kk.clamp(max=size) - 1).unsqueeze(1)
        # Top-p renormalises within the top-k set; without top-k, within the whole row.
        mass = running.gather(1, last_k).squeeze(1)
        if bool((kk >= vocab).any()):
            mass = torch.where(kk < vocab, mass, sub.sum(dim=-1))
        # Index of the first head token whose running mass reaches p (== size: not in this head).
        cut = (running < (pp * mass).unsqueeze(1)).sum(dim=-1)
        with_k = torch.minimum(cut, last_k.squeeze(1))
        cut = torch.where(pp >= 1.0, last_k.squeeze(1), torch.where(kk < vocab, with_k, cut))
        covered = cut < size if size < vocab else torch.ones_like(cut, dtype=torch.bool)
        cut = cut.clamp(max=size - 1)
        threshold[pending[covered]] = head.gather(1, cut.unsqueeze(1)).squeeze(1)[covered]
        pending = pending[~covered]
    return threshold
