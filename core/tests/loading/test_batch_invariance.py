"""The batch-invariance report: each part a configuration runs, declared or not, and the engine's use of it."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import Any, ClassVar

import pytest
import torch

from paged_core.api import BackendCapabilities, FusedOps
from paged_core.errors import UnsupportedConfigError
from paged_core.loading.batch_invariance import batch_invariance, model_expert_kinds, model_linear_kinds
from paged_core.quant import Q4_0, Q8_0
from paged_core.runner.packed_linear import PackedLinearModule
from paged_core.testing import ReferenceBackend, ReferenceFusedOps, random_packed

from ..engine_helpers import make_engine

INVARIANT = dataclasses.replace(ReferenceBackend.capabilities(), batch_invariant=True)
VARIANT = dataclasses.replace(INVARIANT, batch_invariant=False)


class PackedOnly(FusedOps):
    """Kernels for q8_0 (declared invariant) and dense weights (not declared), layer ops declared."""

    name = "packed-only"
    linear_formats: ClassVar[frozenset[str]] = frozenset({"q8_0"})
    batch_invariant_linear: ClassVar[frozenset[str]] = frozenset({"q8_0"})
    batch_invariant_layer_ops: ClassVar[bool] = True

    def linear(self, x: torch.Tensor, packed: Any) -> torch.Tensor:
        return super().linear(x, packed)


def _parts(report: Any) -> list[str]:
    return [p.part for p in report.variant]


def test_declared_everywhere_on_the_eager_fused_path_is_invariant() -> None:
    report = batch_invariance(INVARIANT, ReferenceFusedOps(), Counter({"q4_0": 3, "bfloat16": 1}), backend="ref")
    assert report.invariant and report.variant == () and report.reasons() == []
    line = report.describe()
    assert line.startswith("batch-invariant: yes (") and "linear bfloat16 x1, q4_0 x3" in line and "\n" not in line
    report.require()  # nothing to refuse


def test_every_undeclared_part_is_named_with_its_reason() -> None:
    report = batch_invariance(
        VARIANT,
        PackedOnly(),
        ["q8_0", "q8_0", "float32", "q4_0"],
        backend="vendor",
        model_path="fused",
        graph_mode="compiled",
        tensor_parallel_size=2,
    )
    assert _parts(report) == [
        "attention",
        "linear float32 (1 layer)",
        "linear q4_0 (1 layer)",
        "graph_mode compiled",
        "tensor_parallel_size 2",
    ]
    reasons = report.reasons()
    assert reasons[0] == "attention: backend 'vendor' does not declare batch_invariant"
    assert reasons[1].startswith("linear float32 (1 layer): packed-only FusedOps (") and "reference" not in reasons[1]
    assert reasons[2].endswith(
        f"packed by the reference (not one of packed-only FusedOps ({PackedOnly.__module__}.PackedOnly)'s)"
    )
    assert "inductor" in reasons[3]
    assert not report.invariant and report.describe() == "batch-invariant: no (" + "; ".join(reasons) + ")"
    with pytest.raises(UnsupportedConfigError) as err:
        report.require()
    assert str(err.value).startswith("--batch-invariant refused: ") and all(r in str(err.value) for r in reasons)


def test_the_base_ops_transformers_path_and_device_graphs_are_not_proven() -> None:
    base = batch_invariance(INVARIANT, FusedOps(), ["float32"], backend="ref")
    assert _parts(base) == ["layer ops", "linear float32 (1 layer)"]
    hf = batch_invariance(
        INVARIANT, ReferenceFusedOps(), ["float32"], backend="ref", model_path="transformers", graph_mode="device"
    )
    assert _parts(hf) == ["model_impl transformers", "graph_mode device"]  # its layer ops are torch's own
    assert "not bit for bit" in hf.reasons()[1]


def test_model_linear_kinds_counts_packed_dense_and_a_tied_head() -> None:
    emb = torch.nn.Embedding(16, 32)
    head = torch.nn.Linear(32, 16, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict(
        {
            "emb": emb,
            "q": PackedLinearModule(random_packed(Q4_0, 32, 32)),
            "k": PackedLinearModule(random_packed(Q8_0, 8, 32)),
            "v": PackedLinearModule(random_packed(Q4_0, 8, 32)),
            "o": torch.nn.Linear(32, 32).bfloat16(),
            "lm_head": head,
        }
    )
    assert model_linear_kinds(model) == Counter({"q4_0": 2, "q8_0": 1, "bfloat16": 1, "float32": 1})


@pytest.fixture(scope="module")
def reference_loaded(tiny_loaded: Any) -> Any:
    """The tiny weights on the reference backend (batch-invariant as declared)."""
    return dataclasses.replace(tiny_loaded, backend=ReferenceBackend(device="cpu"), decoders={})


def test_the_engine_reports_and_logs_it_once(reference_loaded: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="paged.engine"):
        engine = make_engine(reference_loaded, batch_invariant=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch-invariant:")]
    assert lines == [lines[0]] and lines[0].startswith("batch-invariant: yes") and "linear bfloat16 x15" in lines[0]
    facts, stats = engine.core.facts(), engine.core.stats()
    assert facts.batch_invariant and facts.batch_variant == [] and stats.batch_invariant


def test_the_engine_reports_what_is_not(reference_loaded: Any) -> None:
    engine = make_engine(reference_loaded, model_impl="transformers")
    facts = engine.core.facts()
    assert not facts.batch_invariant and not engine.core.stats().batch_invariant
    assert [v.split(":")[0] for v in facts.batch_variant] == ["model_impl transformers"]


@pytest.mark.parametrize(
    ("overrides", "parts"),
    [
        ({"model_impl": "transformers"}, ["model_impl transformers"]),
        ({"graph_mode": "compiled"}, ["graph_mode compiled"]),
    ],
)
def test_batch_invariant_refuses_at_start_naming_every_part(
    reference_loaded: Any, overrides: dict[str, str], parts: list[str]
) -> None:
    with pytest.raises(UnsupportedConfigError, match="--batch-invariant refused") as err:
        make_engine(reference_loaded, batch_invariant=True, **overrides)
    assert all(f"{p}:" in str(err.value) for p in parts)


def test_a_backend_that_does_not_declare_it_is_refused(reference_loaded: Any) -> None:
    class Undeclared(ReferenceBackend):
        name = "reference-undeclared"

        @classmethod
        def capabilities(cls) -> BackendCapabilities:
            return dataclasses.replace(ReferenceBackend.capabilities(), batch_invariant=False)

        def fused_ops(self) -> FusedOps:
            return FusedOps()

    loaded = dataclasses.replace(reference_loaded, backend=Undeclared(device="cpu"), decoders={})
    with pytest.raises(UnsupportedConfigError) as err:
        make_engine(loaded, backend="reference", batch_invariant=True)
    msg = str(err.value)
    assert "attention: backend 'reference-undeclared' does not declare batch_invariant" in msg
    assert "layer ops: reference FusedOps" in msg and "linear bfloat16 (15 layers)" in msg


class MoEDeclared(PackedOnly):
    """:class:`PackedOnly` whose routed experts are declared invariant for q4_0 and q8_0 only."""

    moe_formats: ClassVar[frozenset[str]] = frozenset({"q4_0", "q8_0"})
    batch_invariant_moe: ClassVar[frozenset[str]] = frozenset({"q4_0", "q8_0"})

    def moe(self, x: torch.Tensor, router_logits: torch.Tensor, experts: Any, routing: Any) -> torch.Tensor:
        return super().moe(x, router_logits, experts, routing)


def test_routed_experts_count_when_both_their_kinds_are_declared() -> None:
    experts = Counter({("q4_0", "q8_0"): 2, ("q4_0", "float32"): 1})
    report = batch_invariance(INVARIANT, MoEDeclared(), ["q8_0"], backend="vendor", expert_kinds=experts)
    assert _parts(report) == ["routed experts q4_0/float32 (1 layer)"]
    assert "batch_invariant_moe" in report.reasons()[0]
    assert "routed experts q4_0/float32 x1, q4_0/q8_0 x2" in report.parts
    # The base class declares no routed experts: every MoE layer is named.
    base = batch_invariance(
        INVARIANT, ReferenceFusedOps(), [], backend="ref", expert_kinds=Counter({("q8_0", "q8_0"): 3})
    )
    assert _parts(base) == ["routed experts q8_0/q8_0 (3 layers)"]


def test_model_expert_kinds_reads_transformers_experts_modules() -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[1],
    )
    model = Qwen3MoeForCausalLM(config)
    assert model_expert_kinds(model) == Counter({("float32", "float32"): 2})
