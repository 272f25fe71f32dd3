"""PackedExpertsModule: transformers' experts-module forward over packed expert rows, and the fused decoder's view."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from paged_core.contract.moe import PackedExperts
from paged_core.errors import UnsupportedConfigError
from paged_core.quant import Q4_0, Q8_0, QuantizedWeight, quantize_blocks
from paged_core.runner.fused.moe_layer import build_moe, family_routing, moe_refusal
from paged_core.runner.packed_experts import (
    PackedExpertsModule,
    expert_weights,
    packed_expert_bytes,
    packed_experts_modules,
)


def _model() -> Any:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        initializer_range=0.3,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _packed(w: torch.Tensor, fmt: Any) -> QuantizedWeight:
    return quantize_blocks(w.reshape(-1, w.shape[-1]), fmt, "experts")


def _pack_layer(model: Any, fmt: Any) -> PackedExpertsModule:
    """Layer 0's experts as packed rows; transformers' module gets the dequantized values (the oracle)."""
    experts = model.model.layers[0].mlp.experts
    gate_up, down = _packed(experts.gate_up_proj.detach(), fmt), _packed(experts.down_proj.detach(), fmt)
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up.dequantize().reshape(experts.gate_up_proj.shape))
        experts.down_proj.copy_(down.dequantize().reshape(experts.down_proj.shape))
    return PackedExpertsModule(gate_up, down, experts.act_fn, "model.layers.0.mlp.experts")


@pytest.mark.parametrize("fmt", [Q8_0, Q4_0], ids=lambda f: f.name)
def test_forward_equals_transformers_experts_on_the_dequantized_values(fmt: Any) -> None:
    model = _model()
    packed = _pack_layer(model, fmt)
    original = model.model.layers[0].mlp.experts
    x = torch.randn(2, 7, 64)
    flat = x.reshape(-1, 64)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(14)])
    weights = torch.rand(14, 2).softmax(-1)
    with torch.no_grad():
        want = original(flat, ids, weights).reshape(2, 7, 64)
        got = packed(x, ids.reshape(2, 7, 2), weights.reshape(2, 7, 2))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert packed.weights.kinds == (fmt.name, fmt.name)
    # gate_up: E * 2I = 256 rows of H = 64 values; down: E * H = 256 rows of I = 32.
    assert packed_expert_bytes(packed) == 256 * fmt.row_bytes(64) + 256 * fmt.row_bytes(32)


def test_inside_a_step_a_bound_module_runs_the_backends_experts_on_its_packing() -> None:
    """Bound to a backend's ops, an engine step runs ``ops.experts`` on what ``ops`` packed (formats it does not
    declare packed by the reference); outside a step, or for other ops, the contract's arithmetic."""
    from paged_core.api import FusedOps
    from paged_core.runner.experts import experts_step

    seen: list[PackedExperts] = []

    class Spy(FusedOps):
        moe_formats = frozenset({"q8_0"})

        def experts(
            self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts, activation: Any
        ) -> torch.Tensor:
            seen.append(experts)
            return super().experts(x, weights, ids, experts, activation)

    packed, spy = _pack_layer(_model(), Q8_0), Spy()
    x, ids, weights = torch.randn(5, 64), torch.stack([torch.randperm(4)[:2] for _ in range(5)]), torch.rand(5, 2)
    with torch.no_grad():
        outside = packed(x, ids, weights)
        packed.bind(spy)
        assert packed.bound is not None and seen == []
        with experts_step(spy):
            inside = packed(x, ids, weights)
        with experts_step(FusedOps()):
            other = packed(x, ids, weights)
    assert seen == [packed.bound[1]]
    assert torch.equal(inside, outside) and torch.equal(other, outside)


def test_the_fused_decoder_takes_its_packed_rows_as_they_are() -> None:
    model = _model()
    packed = _pack_layer(model, Q8_0)
    mlp = model.model.layers[0].mlp
    mlp.experts = packed
    assert packed_experts_modules(model) == [("model.layers.0.mlp.experts", packed)]
    assert moe_refusal(model) is None
    gate_up, down = expert_weights(packed)
    assert gate_up is packed.weights.gate_up and down is packed.weights.down
    from paged_core.contract.fused_ops import FusedOps

    layer = build_moe(FusedOps(), family_routing(model), mlp)
    assert layer.experts.gate_up is gate_up and layer.experts.down is down


def test_a_packed_layer_the_config_does_not_route_is_refused_naming_it() -> None:
    model = _model()
    experts = model.model.layers[0].mlp.experts
    three = PackedExpertsModule(
        _packed(experts.gate_up_proj.detach()[:3], Q8_0), _packed(experts.down_proj.detach()[:3], Q8_0), experts.act_fn
    )
    model.model.layers[0].mlp.experts = three
    assert moe_refusal(model) == "Qwen3MoeForCausalLM: layer 0: 3 experts, the config routes over 4"


def test_an_activation_the_contract_lacks_is_refused_naming_the_module() -> None:
    model = _model()
    experts = model.model.layers[0].mlp.experts
    gate_up, down = _packed(experts.gate_up_proj.detach(), Q8_0), _packed(experts.down_proj.detach(), Q8_0)
    with pytest.raises(UnsupportedConfigError, match=r"blk\.0 experts: activation ReLU \(needs SiLU or tanh GELU\)"):
        PackedExpertsModule(gate_up, down, torch.nn.ReLU(), "blk.0 experts")
