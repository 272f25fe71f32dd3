"""Row selection without ``index_select``, which is pathologically slow on CPU for wide rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def take_rows(x: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """``x[rows]`` for a sorted or unsorted list of row indexes; may return ``x`` or a view (never write to it)."""
    n = len(rows)
    if n and rows[0] + n - 1 == rows[-1] and list(rows) == list(range(rows[0], rows[0] + n)):
        return x if n == x.shape[0] else x[rows[0] : rows[0] + n]
    return x[torch.tensor(list(rows), dtype=torch.int64, device=x.device)]
