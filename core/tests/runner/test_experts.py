"""transformers' experts modules routed through the contract's arithmetic inside engine steps, their previous
implementation outside; layouts the contract does not serve keep transformers' own (tiny random models, fp32)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from paged_core.api import FusedOps, UnsupportedConfigError
from paged_core.contract.moe import PackedExperts, apply_experts, reference_moe, route_experts
from paged_core.runner import experts as experts_module
from paged_core.runner.experts import EXPERTS_IMPLEMENTATION, experts_step, route_model_experts

from .test_moe_families import mixtral, qwen3_moe


def _inputs(tokens: int, experts: int, top_k: int, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 32, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    return x, weights, ids


def test_moe_model_experts_switch_to_the_paged_implementation_once() -> None:
    model = qwen3_moe(mlp_only_layers=[2])
    before = model.config._experts_implementation
    routed = route_model_experts(model)
    assert routed.routed == ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts", "model.layers.3.mlp.experts")
    assert routed.kept == {}
    assert model.config._experts_implementation == EXPERTS_IMPLEMENTATION
    assert route_model_experts(model) == routed  # idempotent
    # Outside a step the previous implementation still runs (not this one calling itself).
    twin = qwen3_moe(mlp_only_layers=[2])
    assert twin.config._experts_implementation == before
    x, weights, ids = _inputs(9, 6, 2)
    with torch.no_grad():
        got = model.model.layers[0].mlp.experts(x, ids, weights)
        want = twin.model.layers[0].mlp.experts(x, ids, weights)
    assert torch.equal(got, want)
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert before != EXPERTS_IMPLEMENTATION
    expected = ALL_EXPERTS_FUNCTIONS.get_interface(before, None)
    assert experts_module._previous(model.model.layers[0].mlp.experts) is expected


def test_inside_a_step_the_experts_run_the_backends_experts_op() -> None:
    model = mixtral()
    calls: list[tuple[torch.Tensor, torch.Tensor, PackedExperts]] = []

    class Spy(FusedOps):
        def experts(
            self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts, activation: Any
        ) -> torch.Tensor:
            calls.append((weights, ids, experts))
            return super().experts(x, weights, ids, experts, activation)

    spy = Spy()
    route_model_experts(model, spy)
    experts = model.model.layers[1].mlp.experts
    x, weights, ids = _inputs(23, 4, 2)
    packed = PackedExperts(experts.gate_up_proj.detach(), experts.down_proj.detach())
    with torch.no_grad(), experts_step(spy):
        got = experts(x, ids, weights)
    assert len(calls) == 1 and torch.equal(calls[0][0], weights) and torch.equal(calls[0][1], ids)
    assert calls[0][2] is experts_module.packed_experts(experts, spy)  # packed once, at routing
    assert torch.equal(got, apply_experts(x, weights, ids, packed, "silu"))
    with torch.no_grad():
        theirs = experts(x, ids, weights)
    assert len(calls) == 1  # outside a step: transformers' implementation, computing the same function
    torch.testing.assert_close(got, theirs, rtol=1e-5, atol=1e-5)


def test_the_whole_model_inside_a_step_matches_transformers() -> None:
    model = qwen3_moe(norm_topk_prob=True)
    twin = copy.deepcopy(model)
    route_model_experts(model)
    ids = torch.randint(0, 64, (1, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), experts_step():
        got = model(input_ids=ids).logits
    with torch.no_grad():
        want = twin(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_shared_expert_beside_the_routed_ones_matches_transformers() -> None:
    """Qwen2-MoE: a dense shared expert (gated by its own sigmoid) outside the op, the routed experts (softmax,
    not renormalised) through the backend's ``experts``; the whole model as transformers computes it."""
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    from .test_moe_families import SMALL

    fields = {"num_hidden_layers": 2, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    config = Qwen2MoeConfig(**{**SMALL, **fields, "shared_expert_intermediate_size": 24})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    assert model.model.layers[0].mlp.shared_expert is not None
    twin = copy.deepcopy(model)
    routed = route_model_experts(model)
    assert len(routed.routed) == 2 and not routed.kept
    ids = torch.randint(0, 64, (1, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), experts_step():
        got = model(input_ids=ids).logits
    with torch.no_grad():
        want = twin(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_layout_the_contract_does_not_serve_keeps_transformers_own() -> None:
    model = mixtral()
    twin = copy.deepcopy(model)
    model.model.layers[0].mlp.experts.act_fn = torch.nn.GELU()
    twin.model.layers[0].mlp.experts.act_fn = torch.nn.GELU()
    routed = route_model_experts(model)
    assert routed.routed == ("model.layers.1.mlp.experts",)
    assert routed.kept == {"model.layers.0.mlp.experts": "MixtralExperts's activation GELU (needs SiLU or tanh GELU)"}
    x, weights, ids = _inputs(11, 4, 2)
    with torch.no_grad(), experts_step():
        got = model.model.layers[0].mlp.experts(x, ids, weights)
    with torch.no_grad():
        want = twin.model.layers[0].mlp.experts(x, ids, weights)
    assert torch.equal(got, want)


def test_a_class_on_another_registry_is_left_alone() -> None:
    from transformers import MixtralConfig
    from transformers.integrations.moe import ExpertsInterface, use_experts_implementation

    other = ExpertsInterface()

    @use_experts_implementation(experts_interface=other)
    class ForeignExperts(torch.nn.Module):
        def __init__(self, config: Any) -> None:
            super().__init__()
            self.num_experts = 2
            self.gate_up_proj = torch.nn.Parameter(torch.zeros(2, 8, 4))
            self.down_proj = torch.nn.Parameter(torch.zeros(2, 4, 4))
            self.act_fn = torch.nn.SiLU()

    config = MixtralConfig()
    config._experts_implementation = "eager"
    holder = torch.nn.Sequential(ForeignExperts(config))
    routed = route_model_experts(holder)
    assert routed.routed == () and routed.kept == {"0": "its class dispatches through another experts registry"}
    assert config._experts_implementation == "eager"


def test_models_without_experts_are_untouched() -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from .test_moe_families import SMALL

    dense = AutoModelForCausalLM.from_config(Qwen3Config(**SMALL, num_hidden_layers=1))
    assert route_model_experts(dense).routed == ()
    assert route_model_experts(None).routed == ()


def test_apply_experts_is_the_reference_moe_after_routing() -> None:
    model = mixtral()
    experts = model.model.layers[0].mlp.experts
    packed = PackedExperts(experts.gate_up_proj.detach(), experts.down_proj.detach())
    x = torch.randn(13, 32)
    logits = torch.randn(13, 4)
    from paged_core.api import MoERouting

    routing = MoERouting(4, 2, renormalize=True)
    weights, ids = route_experts(logits, routing)
    assert torch.equal(apply_experts(x, weights, ids, packed), reference_moe(x, logits, packed, routing))
    assert apply_experts(x[:0], weights[:0], ids[:0], packed).shape == (0, 32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": torch.zeros(3, 31)}, r"experts x \(3, 31\): the experts need \[T, 32\]"),
        ({"ids": torch.zeros(4, 2, dtype=torch.int64)}, r"weights \(3, 2\) and ids \(4, 2\): .* needs both \[3, k\]"),
        ({"ids": torch.full((3, 2), 4)}, r"experts ids range over 4 \.\. 4; the experts are 0 \.\. 3"),
        ({"ids": torch.full((3, 2), -1)}, r"experts ids range over -1 \.\. -1"),
        ({"ids": torch.zeros(3, 2)}, r"experts ids must be integers and weights floats"),
    ],
)
def test_apply_experts_refuses_inputs_that_do_not_fit(change: dict[str, torch.Tensor], message: str) -> None:
    experts = PackedExperts(torch.randn(4, 16, 32), torch.randn(4, 32, 8))
    args = {"x": torch.zeros(3, 32), "weights": torch.ones(3, 2), "ids": torch.zeros(3, 2, dtype=torch.int32)}
    args.update(change)
    with pytest.raises(UnsupportedConfigError, match=message):
        apply_experts(args["x"], args["weights"], args["ids"], experts)
