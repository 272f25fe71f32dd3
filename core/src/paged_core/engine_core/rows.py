"""A step's logits rows, keyed by the scheduler request each belongs to, and how they are split among consumers."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Rows:
    """``counts[i]`` consecutive logits rows for request ``req_ids[i]``: 1, or 1 + its drafts when verifying.

    ``logits`` is ``[sum(counts), V]``, or ``None`` when no row of the step reached its last known token.
    """

    req_ids: list[str]
    counts: list[int]
    logits: torch.Tensor | None

    @staticmethod
    def none() -> Rows:
        return Rows([], [], None)

    def __bool__(self) -> bool:
        return self.logits is not None and bool(self.req_ids)

    def split(self, mine: Callable[[str, int], bool]) -> tuple[Rows, Rows]:
        """The rows of the requests ``mine(req_id, count)`` picks, and the others; each in step order.

        A side that holds every row is ``self`` (no copy of the logits).
        """
        if not self:
            return Rows.none(), self
        picked = [mine(rid, c) for rid, c in zip(self.req_ids, self.counts, strict=True)]
        if all(picked):
            return self, Rows.none()
        if not any(picked):
            return Rows.none(), self
        return self._take(picked, True), self._take(picked, False)

    def _take(self, picked: list[bool], side: bool) -> Rows:
        assert self.logits is not None
        starts = list(itertools.accumulate(self.counts, initial=0))
        which = [i for i, p in enumerate(picked) if p is side]
        index = [r for i in which for r in range(starts[i], starts[i + 1])]
        logits = self.logits.index_select(0, torch.tensor(index, device=self.logits.device))
        return Rows([self.req_ids[i] for i in which], [self.counts[i] for i in which], logits)
