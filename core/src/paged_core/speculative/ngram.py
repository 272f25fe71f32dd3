"""Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from paged_core.speculative.proposer import Proposal

if TYPE_CHECKING:
    from paged_core.sampling.state import SamplingState
    from paged_core.sched.request import Request


class NgramProposer:
    """Proposes, for each sequence, what followed its last ``n`` tokens the last time they occurred.

    ``n`` goes from ``max_n`` down to ``min_n``; the first ``n`` with an earlier occurrence wins, and
    the drafts are the (up to ``k``) tokens after the latest occurrence that has ``k`` after it (else the
    earliest, which has the most). No model runs, so the drafts carry
    no distribution: verification treats each as certain (a point mass), which rejection sampling
    handles exactly. Cost: one vectorised scan of the sequence per ``n`` tried.
    """

    name = "ngram"
    needs_lookahead = False

    def __init__(self, max_n: int, min_n: int) -> None:
        self.max_n = max_n
        self.min_n = min_n

    def propose(
        self, reqs: Sequence[Request], ks: Sequence[int], states: Sequence[SamplingState]
    ) -> list[Proposal | None]:
        """A proposal of at most ``ks[i]`` drafts for each sequence, or ``None`` where nothing matches."""
        return [self._one(r.all_token_ids, k) for r, k in zip(reqs, ks, strict=True)]

    def _one(self, ids: Sequence[int], k: int) -> Proposal | None:
        length = len(ids)
        if k < 1 or length < self.min_n + 1:
            return None
        arr = np.asarray(ids, dtype=np.int64)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = arr[length - n :]
            # Windows starting at 0 .. length-n-1: every earlier occurrence with at least one token after it.
            windows = np.lib.stride_tricks.sliding_window_view(arr[: length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                # The latest occurrence with k tokens after it (recent text predicts best), else the earliest.
                full = hits[hits + n + k <= length]
                start = int(full[-1] if full.size else hits[0]) + n
                drafts = arr[start : start + k].tolist()
                if drafts:
                    return Proposal(drafts)
        return None
