"""Non-contiguous q/k/v views, as models hand them to attention.

The contract lets ``query``, ``key`` and ``value`` be strided views. Two
layouts cover the common shapes: slices of one fused QKV projection along
its last dimension (the token stride is the whole projection's width), and a
token-major view of head-major storage (heads are the outer dimension in
memory, so no two dimensions can be merged by ``view``).
"""

from __future__ import annotations

import torch

from paged_conformance.grid import LAYOUTS

FUSED_PAD = 8
"""Extra columns after v in the fused tensor, so no view can end at the buffer's end by luck."""


def _fused(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    tokens = tensors[0].shape[0]
    widths = [t.shape[1] * t.shape[2] for t in tensors]
    buffer = torch.full(
        (tokens, sum(widths) + FUSED_PAD), float("nan"), dtype=tensors[0].dtype, device=tensors[0].device
    )
    views = []
    start = 0
    for t, width in zip(tensors, widths, strict=True):
        view = buffer[:, start : start + width].view(tokens, t.shape[1], t.shape[2])
        view.copy_(t)
        views.append(view)
        start += width
    return tuple(views)


def _head_major(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def strided(layout: str, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same values as ``tensors`` (each ``[T, heads, head_size]``) in ``layout``.

    ``contiguous`` returns them unchanged; ``fused`` makes them slices of one
    buffer, in argument order; ``head_major`` gives each its own transposed
    storage. Only the values are promised, never the strides' exact numbers.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    if layout == "contiguous" or not tensors or tensors[0].shape[0] == 0:
        return tensors
    if layout == "fused":
        return _fused(tensors)
    return tuple(_head_major(t) for t in tensors)
