"""Fakes whose ``lora_shrink`` / ``lora_expand`` are broken in one known way each, plus a correct reimplementation.

Imported by the nested suite runs as ``lora_fakes:ClassName`` (attention and the other fused ops are the
reference's, through :class:`fused_fakes.FusedFake`).
"""

from __future__ import annotations

import torch
from fused_fakes import FusedFake, FusedFakeBf16

from paged_core.api import FusedOps


def _gathered_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Every token against its own slot's A, gathered per token (no grouping, no host reads)."""
    return torch.einsum("tk,trk->tr", x.float(), a[slots.clamp(min=0)].float())


class GatheredLoraOps(FusedOps):
    """Correct: per-token gathered weights, rows without an adapter masked; traceable pure torch."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return _gathered_shrink(x, a, slots) * (slots >= 0)[:, None]

    def lora_expand(self, y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        delta = torch.einsum("tr,tnr->tn", shrunk.float(), b[slots.clamp(min=0)].float())
        y.copy_(torch.where((slots >= 0)[:, None], (y.float() + delta).to(y.dtype), y))
        return y


class MinusOneIsSlotZeroOps(GatheredLoraOps):
    """Bug: tokens without an adapter (-1) get slot 0's product."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return _gathered_shrink(x, a, slots)


class ExpandReturnsNewOps(GatheredLoraOps):
    """Bug: expand returns the sum as a new tensor and leaves ``y`` as it was (the other fused ops' convention)."""

    def lora_expand(self, y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return super().lora_expand(y.clone(), shrunk, b, slots)


class ShrinkInInputDtypeOps(GatheredLoraOps):
    """Bug: the shrunk rows come back in ``x``'s dtype instead of fp32."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return super().lora_shrink(x, a, slots).to(x.dtype)


class IgnoresStridesOps(GatheredLoraOps):
    """Bug: reads ``x`` as if its rows were packed (a kernel taking the data pointer and the width)."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        packed = torch.as_strided(x, x.shape, (x.shape[1], 1))
        return super().lora_shrink(packed, a, slots)


class HostGroupedOps(FusedOps):
    """Bug for captured steps only: overrides both ops with the reference's grouping, which reads slots on the host."""

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return super().lora_shrink(x, a, slots)

    def lora_expand(self, y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return super().lora_expand(y, shrunk, b, slots)


class GatheredLora(FusedFakeBf16):
    OPS = GatheredLoraOps


class MinusOneIsSlotZero(FusedFake):
    OPS = MinusOneIsSlotZeroOps


class ExpandReturnsNew(FusedFake):
    OPS = ExpandReturnsNewOps


class ShrinkInInputDtype(FusedFakeBf16):
    OPS = ShrinkInInputDtypeOps


class IgnoresStrides(FusedFake):
    OPS = IgnoresStridesOps


class HostGrouped(FusedFake):
    OPS = HostGroupedOps
