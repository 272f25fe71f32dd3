"""Inputs and comparisons of the multi-LoRA checks (``FusedOps.lora_shrink`` / ``lora_expand``).

Adapters come as an engine stacks them: ``S`` = 4 resident slots, ``a`` ``[S, R, K]`` and ``b`` ``[S, N, R]``
with each adapter's rank zero-padded to ``R``, a merged projection's parts stacked along ``R`` and its ``B``
block-diagonal (part ``i``'s output rows read only part ``i``'s rank columns). The oracle is the reference
``FusedOps()`` on contiguous copies taken before the backend's call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_conformance.fused import VIEW_OFFSET, VIEW_PAD, column_view, randn

SLOTS = 4
"""Resident adapter slots of every check."""


@dataclass(frozen=True)
class LoraShape:
    """One projection's adapters: ``K`` inputs and, per part of a merged projection, ``(rank, outputs)``.

    ``ranks`` are the four slots' own ranks (zero-padded to ``R`` = the sum over parts of the largest)."""

    name: str
    in_features: int
    parts: tuple[int, ...]
    """Outputs ``N_i`` of each part (one part: a plain projection)."""
    ranks: tuple[int, ...]
    """Each slot's rank per part."""

    @property
    def part_rank(self) -> int:
        return max(self.ranks)

    @property
    def rank(self) -> int:
        return self.part_rank * len(self.parts)

    @property
    def out_features(self) -> int:
        return sum(self.parts)


LORA_SHAPES: tuple[LoraShape, ...] = (
    LoraShape("rank8", 64, (96,), (8, 8, 8, 8)),
    LoraShape("rank16", 576, (192,), (16, 16, 16, 16)),
    LoraShape("padded", 100, (77,), (4, 16, 13, 8)),
    LoraShape("merged_qkv", 576, (576, 192, 192), (8, 16, 8, 4)),
    LoraShape("merged_gate_up", 67, (150, 150), (16, 8, 16, 12)),
)
"""Ranks 8 and 16 (SmolLM2-135M's k/v projection), ranks zero-padded to 16 at odd sizes, and merged q/k/v and
gate/up projections with block-diagonal ``B``."""

_RUNS = [2] * 9 + [0] * 5 + [-1] * 3 + [1] * 12 + [0] * 7 + [3] * 9 + [-1] * 20 + [2] * 2
SLOT_MIXES: dict[str, list[int]] = {
    "decode": [3],
    "no_adapter": [-1],
    "one_slot": [1] * 23,
    "mixed": [(7 * t) % 5 - 1 for t in range(37)],  # every slot and -1, no two neighbours alike
    "unsorted": _RUNS,  # runs of adapters in no order, a slot twice, rows without one between
    "all_none": [-1] * 9,
    "prefill": [1] * 70 + [-1] * 33 + [0] * 27,  # long runs (kernels that switch forms by run or token count)
}
"""Each token's slot (-1: no adapter), per mix."""


def lora_weights(gen: torch.Generator, shape: LoraShape) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a [S, R, K], b [S, N, R])`` in fp32: each slot's parts at its own rank (zero beyond), ``b`` block-diagonal,
    scaled so that products are of order 1."""
    r, k = shape.part_rank, shape.in_features
    a = torch.zeros(SLOTS, shape.rank, k)
    b = torch.zeros(SLOTS, shape.out_features, shape.rank)
    for slot, rank in enumerate(shape.ranks):
        n0 = 0
        for i, n in enumerate(shape.parts):
            a[slot, i * r : i * r + rank] = randn(gen, rank, k, scale=k**-0.5)
            b[slot, n0 : n0 + n, i * r : i * r + rank] = randn(gen, n, rank, scale=rank**-0.5)
            n0 += n
    return a, b


def spaced_slots(s: torch.Tensor) -> torch.Tensor:
    """``s`` at every other element of a buffer holding slot ``2**40`` elsewhere (a kernel reading past it fails)."""
    buffer = torch.full((2 * s.shape[0] + 1,), 2**40, dtype=s.dtype, device=s.device)
    view = buffer[1::2][: s.shape[0]]
    view.copy_(s)
    return view


def rank_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as a slice along ``dim`` of a buffer 3 wider there, NaN beyond (a stack kept at a larger max rank)."""
    shape = list(t.shape)
    shape[dim] += 3
    buffer = torch.full(shape, float("nan"), dtype=t.dtype, device=t.device)
    view = buffer.narrow(dim, 0, t.shape[dim])
    view.copy_(t)
    return view


@dataclass
class LoraInputs:
    x: torch.Tensor
    y: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    slots: torch.Tensor


def lora_inputs(
    gen: torch.Generator, shape: LoraShape, slots: list[int], dtype: torch.dtype, device: torch.device, strided: bool
) -> LoraInputs:
    """Random ``x`` and ``y`` for ``slots``; with ``strided`` every tensor a view: ``x`` and ``y`` column slices of
    NaN-padded buffers, ``a`` and ``b`` slices of wider rank stacks, ``slots`` every other element."""
    a, b = lora_weights(gen, shape)
    t = len(slots)
    x = randn(gen, t, shape.in_features).to(device, dtype)
    y = randn(gen, t, shape.out_features).to(device, dtype)
    a, b = a.to(device, dtype), b.to(device, dtype)
    s = torch.tensor(slots, dtype=torch.int64, device=device)
    if strided:
        x, y, a, b = column_view(x), column_view(y), rank_view(a, 1), rank_view(b, 2)
        s = spaced_slots(s)
    return LoraInputs(x, y, a, b, s)


def outside_view_bits(y: torch.Tensor) -> torch.Tensor | None:
    """The elements of a column view's buffer outside the view (``None`` for a tensor that is not a view)."""
    base = y._base
    if base is None or base.dim() != 2:
        return None
    cols = y.shape[1]
    return torch.cat(
        (base[:, :VIEW_OFFSET], base[:, VIEW_OFFSET + cols : VIEW_OFFSET + cols + VIEW_PAD]), dim=1
    ).clone()
