"""PackedLinearModule and the engine's routing of packed weights to the backend's kernels or the reference."""

from __future__ import annotations

import logging
from typing import ClassVar

import pytest
import torch

from paged_core.contract.fused_ops import FusedOps, PackedLinear
from paged_core.quant import Q4_0, Q8_0, QuantizedWeight, random_packed, reference_linear
from paged_core.runner.packed_linear import PackedLinearModule, attach_ops, quantize_linears, route_pack


class Q8Only(FusedOps):
    """Declares q8_0 only; marks what it packed so the test can tell whose pack reached linear."""

    name = "q8-only"
    linear_formats: ClassVar[frozenset[str]] = frozenset({"q8_0"})

    def pack_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> PackedLinear:
        return PackedLinear(weight, bias, packed="mine")

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if packed.packed == "mine":
            return super().linear(x, packed) + 0  # the same arithmetic, but through this class
        return super().linear(x, packed)


def test_undeclared_formats_are_packed_by_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    ops = Q8Only()
    assert route_pack(ops, random_packed(Q8_0, 4, 32, gen), None).packed == "mine"
    assert route_pack(ops, random_packed(Q4_0, 4, 32, gen), None).packed is None
    assert route_pack(ops, torch.randn(4, 32), None).packed == "mine"


def test_module_forward_matches_the_reference_for_any_leading_shape(caplog: pytest.LogCaptureFixture) -> None:
    gen = torch.Generator().manual_seed(1)
    mod = PackedLinearModule(random_packed(Q4_0, 12, 64, gen), torch.randn(12, generator=gen))
    parent = torch.nn.Sequential(mod)
    with caplog.at_level(logging.WARNING, logger="paged.engine"):
        attach_ops(parent, Q8Only())
    assert "have no q4_0 kernel (they declare q8_0): 1 layer(s) run the reference" in caplog.text
    x = torch.randn(2, 3, 64, generator=gen)
    out = parent(x)
    assert out.shape == (2, 3, 12)
    want = reference_linear(x.reshape(6, 64), mod.qweight, mod.bias).reshape(2, 3, 12)
    torch.testing.assert_close(out, want)


def test_quantize_linears_packs_every_linear_and_keeps_a_tied_embedding_dense() -> None:
    emb = torch.nn.Embedding(40, 32)
    head = torch.nn.Linear(32, 40, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "proj": torch.nn.Linear(32, 32), "head": head})
    before = model["proj"](torch.ones(1, 32))
    assert quantize_linears(model) == 2
    assert isinstance(model["head"], PackedLinearModule) and isinstance(model["proj"], PackedLinearModule)
    assert isinstance(model["emb"], torch.nn.Embedding)
    torch.testing.assert_close(model["proj"](torch.ones(1, 32)), before, atol=0.05, rtol=0.02)


def test_a_dense_only_port_does_not_inherit_the_references_formats() -> None:
    class DenseOnly(FusedOps):
        def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
            return super().linear(x, packed)

    class NormsOnly(FusedOps):
        pass

    class Child(Q8Only):
        def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
            return super().linear(x, packed)

    assert DenseOnly.linear_formats == frozenset()
    assert NormsOnly.linear_formats == FusedOps.linear_formats  # no linear of its own: the reference's, all formats
    assert Child.linear_formats == frozenset({"q8_0"})
    assert route_pack(DenseOnly(), random_packed(Q8_0, 4, 32), None).packed is None
