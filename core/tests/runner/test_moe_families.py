"""The fused decoder's MoE families: which models it takes, which MLPs route through experts, refusals naming the
layer, and its MoE MLP against transformers' own sparse block (tiny random models, fp32)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from paged_core.api import FusedOps, UnsupportedConfigError
from paged_core.reference.backend import ReferenceBackend
from paged_core.runner.attention import layer_specs
from paged_core.runner.forward import TransformersForward, make_forward, model_path
from paged_core.runner.fused import FusedDecoder, fused_refusal
from paged_core.runner.fused.moe_layer import moe_call

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "initializer_range": 0.3,
}


def qwen3_moe(**extra: Any) -> Any:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    fields = {"num_hidden_layers": 4, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    config = Qwen3MoeConfig(**{**SMALL, **fields, **extra})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def mixtral(**extra: Any) -> Any:
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(
        **{**SMALL, "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2, **extra}
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _decoder(model: Any) -> FusedDecoder:
    return FusedDecoder(model, ReferenceBackend(), layer_specs(model), max_positions=64)


@pytest.mark.parametrize(
    ("extra", "moe_layers"),
    [
        ({}, [True, True, True, True]),
        ({"mlp_only_layers": [1, 2]}, [True, False, False, True]),
        ({"decoder_sparse_step": 2}, [False, True, False, True]),
    ],
)
def test_qwen3_moe_layers_route_where_the_config_makes_them_sparse(
    extra: dict[str, Any], moe_layers: list[bool]
) -> None:
    model = qwen3_moe(**extra)
    assert fused_refusal(model) is None
    decoder = _decoder(model)
    assert [layer.moe is not None for layer in decoder.layers] == moe_layers
    for layer in decoder.layers:
        assert (layer.gate_up is None) == (layer.moe is not None) == (layer.down is None)


@pytest.mark.parametrize("norm", [True, False])
def test_the_family_routing_follows_the_config(norm: bool) -> None:
    routing = _decoder(qwen3_moe(norm_topk_prob=norm)).layers[0].moe.routing  # type: ignore[union-attr]
    assert (routing.num_experts, routing.top_k, routing.renormalize, routing.scoring) == (6, 2, norm, "softmax")
    routing = _decoder(mixtral()).layers[1].moe.routing  # type: ignore[union-attr]
    assert (routing.num_experts, routing.top_k, routing.renormalize) == (4, 2, True)


def test_expert_weights_are_the_modules_own_not_copies() -> None:
    model = mixtral()
    moe = _decoder(model).layers[0].moe
    assert moe is not None
    block = model.model.layers[0].mlp
    assert moe.experts.gate_up.data_ptr() == block.experts.gate_up_proj.data_ptr()  # type: ignore[union-attr]
    assert moe.experts.down.data_ptr() == block.experts.down_proj.data_ptr()  # type: ignore[union-attr]
    assert moe.router.weight.data_ptr() == block.gate.weight.data_ptr()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "build", [lambda: qwen3_moe(norm_topk_prob=True), lambda: qwen3_moe(norm_topk_prob=False), mixtral]
)
def test_the_fused_moe_mlp_equals_the_sparse_block(build: Any) -> None:
    model = build()
    decoder = _decoder(model)
    x = torch.randn(37, 32, generator=torch.Generator().manual_seed(3))
    for layer, module in zip(decoder.layers, model.model.layers, strict=True):
        moe = layer.moe
        assert moe is not None
        got = decoder._moe(x, decoder.ops.linear(x, moe.router), moe.experts, moe.routing)
        with torch.no_grad():
            want = module.mlp(x[None])[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_reference_moe_is_kept_out_of_compiled_graphs_a_backends_own_is_not() -> None:
    class Own(FusedOps):
        def moe(self, x: Any, router_logits: Any, experts: Any, routing: Any) -> Any:
            return super().moe(x, router_logits, experts, routing)

    ops = FusedOps()
    assert moe_call(ops) != ops.moe  # wrapped by torch.compiler.disable
    own = Own()
    assert moe_call(own) == own.moe


def _other_router(model: Any, layer: int) -> None:
    gate = model.model.layers[layer].mlp.gate
    gate.__class__ = type("GroupLimitedRouter", (type(gate),), {})


def _gelu_experts(model: Any, layer: int) -> None:
    model.model.layers[layer].mlp.experts.act_fn = torch.nn.GELU()


def _transposed(model: Any, layer: int) -> None:
    model.model.layers[layer].mlp.experts.is_transposed = True


def _fewer_experts(model: Any, layer: int) -> None:
    experts = model.model.layers[layer].mlp.experts
    experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj[:3].clone())
    experts.down_proj = torch.nn.Parameter(experts.down_proj[:3].clone())
    experts.num_experts = 3


def _biased_router(model: Any, layer: int) -> None:
    model.model.layers[layer].mlp.gate.bias = torch.nn.Parameter(torch.zeros(4))


def _dense_mlp_without_gate(model: Any, layer: int) -> None:
    model.model.layers[layer].mlp = torch.nn.Identity()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_other_router, r"layer 1: router GroupLimitedRouter \(the fused decoder knows MixtralTopKRouter's rule\)"),
        (_gelu_experts, r"layer 1: MixtralExperts's activation GELU \(needs SiLU or tanh GELU\)"),
        (_transposed, r"layer 1: MixtralExperts stores its weights transposed"),
        (_fewer_experts, r"layer 1: 3 experts, the config routes over 4"),
        (_biased_router, r"layer 1: the router has a bias"),
        (_dense_mlp_without_gate, r"layer 1's mlp Identity is neither a sparse block nor a gated MLP"),
    ],
)
def test_a_layer_the_op_cannot_serve_is_refused_by_name_and_auto_falls_back(damage: Any, reason: str) -> None:
    model = mixtral()
    damage(model, 1)
    refusal = fused_refusal(model)
    assert refusal is not None and refusal.startswith("MixtralForCausalLM: ")
    assert re.search(reason, refusal), refusal
    backend, specs = ReferenceBackend(), layer_specs(model)
    with pytest.raises(UnsupportedConfigError, match=f"model_impl='fused' refused: .*{reason}"):
        make_forward("fused", model, backend, specs, 64)
    with pytest.raises(UnsupportedConfigError, match="the fused decoder cannot run this model"):
        FusedDecoder(model, backend, specs, 64)
    assert model_path("auto", model) == "transformers"
    assert isinstance(make_forward("auto", model, backend, specs, 64), TransformersForward)


def test_a_routing_the_op_cannot_take_is_refused_naming_the_field() -> None:
    model = mixtral()
    model.config.num_experts_per_tok = 5
    assert fused_refusal(model) == (
        "MixtralForCausalLM: its routing: MoERouting.top_k = 5: must be an int between 1 and num_experts = 4"
    )


def test_a_dense_family_is_unchanged_and_other_moe_families_are_not_fused() -> None:
    from transformers import AutoModelForCausalLM, OlmoeConfig, Qwen3Config

    dense = AutoModelForCausalLM.from_config(Qwen3Config(**SMALL, num_hidden_layers=2), dtype=torch.float32)
    decoder = _decoder(dense)
    assert all(layer.moe is None and layer.gate_up is not None for layer in decoder.layers)
    olmoe = AutoModelForCausalLM.from_config(
        OlmoeConfig(**SMALL, num_hidden_layers=1, num_experts=4, num_experts_per_tok=2), dtype=torch.float32
    )
    assert (fused_refusal(olmoe) or "").startswith("OlmoeForCausalLM is not one of the fused families (")
