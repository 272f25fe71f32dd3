"""FusedOps' batch-invariance declarations: defaults, the inheritance rule and the weight kinds they name."""

from __future__ import annotations

from typing import ClassVar

import torch

from paged_core.api import LINEAR_FORMATS, FusedOps, PackedLinear
from paged_core.contract.fused_ops import DENSE_LINEAR_KINDS, LAYER_OPS, LINEAR_KINDS, linear_kind
from paged_core.reference.fused import ReferenceFusedOps
from paged_core.testing import random_packed


def test_the_base_class_promises_nothing() -> None:
    # Batched torch is not batch-invariant (the module docstring gives the measurements).
    assert FusedOps.batch_invariant_linear == frozenset()
    assert FusedOps.batch_invariant_layer_ops is False


def test_weight_kinds_are_the_packed_formats_then_the_dense_dtypes() -> None:
    assert LINEAR_KINDS == (*LINEAR_FORMATS, "float32", "bfloat16", "float16")
    assert DENSE_LINEAR_KINDS == ("float32", "bfloat16", "float16")
    assert LAYER_OPS == ("rms_norm", "add_rms_norm", "silu_and_mul", "rotary", "rotate_heads")
    for name, fmt in LINEAR_FORMATS.items():
        assert linear_kind(random_packed(fmt, 4, 256)) == name
    for kind in DENSE_LINEAR_KINDS:
        assert linear_kind(torch.zeros(2, 2, dtype=getattr(torch, kind))) == kind


class Declares(FusedOps):
    """Declares both, overrides nothing: a mixin for the inheritance checks."""

    batch_invariant_linear: ClassVar[frozenset[str]] = frozenset({"q8_0", "bfloat16"})
    batch_invariant_layer_ops: ClassVar[bool] = True


def test_an_override_without_a_declaration_promises_nothing() -> None:
    class OwnLinear(FusedOps):
        def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
            return super().linear(x, packed)

    class OwnNorm(FusedOps):
        def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            return super().rms_norm(x, weight, eps)

    class OwnRotation(FusedOps):
        def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
            return super().rotate_heads(x)

    # Set on the class itself, so that a later base in the MRO (a declaring mixin) cannot lend its promise.
    assert "batch_invariant_linear" in vars(OwnLinear) and OwnLinear.batch_invariant_linear == frozenset()
    assert "batch_invariant_layer_ops" not in vars(OwnLinear)  # the layer ops are still the base class's
    assert "batch_invariant_layer_ops" in vars(OwnNorm) and OwnNorm.batch_invariant_layer_ops is False
    assert "batch_invariant_linear" not in vars(OwnNorm)
    assert "batch_invariant_layer_ops" in vars(OwnRotation) and OwnRotation.batch_invariant_layer_ops is False

    class Mixed(OwnLinear, OwnNorm, Declares):
        pass

    assert Mixed.batch_invariant_linear == frozenset() and Mixed.batch_invariant_layer_ops is False


def test_a_declaration_in_between_is_inherited_and_one_of_its_own_wins() -> None:
    class Child(Declares):
        def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
            return super().linear(x, packed)

        def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
            return super().silu_and_mul(x)

    class OwnWord(ReferenceFusedOps):
        batch_invariant_linear = frozenset({"q4_0"})

        def rotary(
            self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return super().rotary(positions, query, key, cos_sin_cache)

    assert Child.batch_invariant_linear == frozenset({"q8_0", "bfloat16"}) and Child.batch_invariant_layer_ops
    assert OwnWord.batch_invariant_linear == frozenset({"q4_0"}) and OwnWord.batch_invariant_layer_ops
    assert ReferenceFusedOps.batch_invariant_linear == frozenset(LINEAR_KINDS)
