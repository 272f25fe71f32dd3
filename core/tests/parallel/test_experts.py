"""Expert sharding without processes: which experts a rank keeps, the slices, and the combine's arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.moe import MoERouting, PackedExperts, reference_moe
from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.experts import (
    EXPERT_SHARD,
    ExpertShard,
    check_ep,
    expert_parallel_moe,
    expert_range,
    local_experts,
    model_experts,
    shard_experts,
    slice_experts,
)
from paged_core.quant.quantize import quantize_int8

E, H, INTER = 8, 32, 16


def _experts(seed: int = 0, experts: int = E) -> PackedExperts:
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(experts, 2 * INTER, H, generator=g) * 0.3
    down = torch.randn(experts, H, INTER, generator=g) * 0.3
    return PackedExperts(gate_up, down)


def test_ranks_hold_contiguous_equal_shares() -> None:
    assert [expert_range(8, r, 2) for r in range(2)] == [ExpertShard(8, 0, 4), ExpertShard(8, 4, 8)]
    assert [(s.start, s.stop) for s in (expert_range(60, r, 4) for r in range(4))] == [
        (0, 15),
        (15, 30),
        (30, 45),
        (45, 60),
    ]
    assert expert_range(4, 0, 1) == ExpertShard(4, 0, 4)
    with pytest.raises(UnsupportedConfigError, match="6 experts do not split over 4 ranks"):
        expert_range(6, 0, 4)
    with pytest.raises(ValueError):
        expert_range(8, 2, 2)


def test_dense_slices_are_views_of_the_expert_dimension() -> None:
    experts = _experts()
    shard = expert_range(E, 1, 2)
    part = local_experts(experts, shard)
    assert part.num_experts == 4 and part.hidden_size == H and part.intermediate_size == INTER
    for local in range(4):
        gu, dn = part.expert(local)
        full_gu, full_dn = experts.expert(4 + local)
        assert torch.equal(gu, full_gu) and torch.equal(dn, full_dn)
    assert isinstance(part.gate_up, torch.Tensor) and isinstance(experts.gate_up, torch.Tensor)
    assert part.gate_up.data_ptr() == experts.gate_up[4].data_ptr()  # a view, no copy


def test_packed_slices_keep_whole_experts_rows() -> None:
    experts = _experts()
    assert isinstance(experts.gate_up, torch.Tensor) and isinstance(experts.down, torch.Tensor)
    gate_up = quantize_int8(experts.gate_up.reshape(E * 2 * INTER, H))
    down = quantize_int8(experts.down.reshape(E * H, INTER))
    packed = PackedExperts(gate_up, down)
    shard = expert_range(E, 3, 4)
    part = local_experts(packed, shard)
    assert part.num_experts == 2 and part.kinds == packed.kinds
    for local in range(2):
        for a, b in zip(part.expert(local), packed.expert(shard.start + local), strict=True):
            assert torch.equal(a.data, b.data)
    with pytest.raises(UnsupportedConfigError, match="does not hold 8 experts"):
        slice_experts(torch.zeros(6, 2, 2), shard)


def _combine(x: torch.Tensor, logits: torch.Tensor, experts: PackedExperts, routing: MoERouting, world: int) -> Any:
    """Every rank's partial (its experts' share) and their sum, as the all-reduce would give it."""
    partials = []
    for rank in range(world):
        shard = expert_range(routing.num_experts, rank, world)
        partials.append(expert_parallel_moe(x, logits, local_experts(experts, shard), routing, shard, None))
    total = partials[0].clone()
    for p in partials[1:]:
        total += p
    return partials, total


@pytest.mark.parametrize("world", [2, 4])
def test_top_2_over_two_or_four_ranks_sums_to_one_rank_s_bits(world: int) -> None:
    experts = _experts(1)
    routing = MoERouting(E, 2, renormalize=True)
    g = torch.Generator().manual_seed(2)
    x, logits = torch.randn(37, H, generator=g), torch.randn(37, E, generator=g)
    one = reference_moe(x, logits, experts, routing)
    partials, total = _combine(x, logits, experts, routing, world)
    # At most two ranks hold a token's two experts: the sum adds the same two products (or one and zeros).
    assert torch.equal(total, one)
    # Each rank's partial is really partial: a token none of whose experts it holds gets exact zeros.
    _, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    owner = ids[:, :2] // (E // world)
    for rank, part in enumerate(partials):
        none_here = ~(owner == rank).any(dim=1)
        assert none_here.any()
        assert torch.equal(part[none_here], torch.zeros_like(part[none_here]))


def test_top_4_matches_within_float32_rounding_and_empty_shares_are_zero() -> None:
    experts = _experts(3)
    routing = MoERouting(E, 4, renormalize=False)
    g = torch.Generator().manual_seed(4)
    x, logits = torch.randn(19, H, generator=g), torch.randn(19, E, generator=g)
    _, total = _combine(x, logits, experts, routing, 2)
    torch.testing.assert_close(total, reference_moe(x, logits, experts, routing), rtol=1e-6, atol=1e-6)
    # One token routed entirely to rank 0's experts: rank 1 contributes exactly nothing.
    logits1 = torch.tensor([[9.0, 8.0, 7.0, 6.0, 0.0, 0.0, 0.0, 0.0]])
    shard = expert_range(E, 1, 2)
    part = expert_parallel_moe(x[:1], logits1, local_experts(experts, shard), routing, shard, None)
    assert torch.equal(part, torch.zeros(1, H))


def test_bf16_activations_are_combined_in_float32_and_rounded_once() -> None:
    experts = _experts(5)
    routing = MoERouting(E, 2, renormalize=True)
    g = torch.Generator().manual_seed(6)
    x, logits = torch.randn(11, H, generator=g).bfloat16(), torch.randn(11, E, generator=g)
    shard = expert_range(E, 0, 2)
    seen = []

    def reduce(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.dtype)
        return t

    out = expert_parallel_moe(x, logits, local_experts(experts, shard), routing, shard, reduce)
    assert seen == [torch.float32] and out.dtype == torch.bfloat16


def test_the_shard_must_match_the_local_experts() -> None:
    with pytest.raises(UnsupportedConfigError, match="8 local experts, the shard holds 4"):
        expert_parallel_moe(
            torch.zeros(1, H),
            torch.zeros(1, E),
            _experts(),
            MoERouting(E, 2, renormalize=True),
            expert_range(E, 0, 2),
            None,
        )


def _spec(heads: int = 4, kv: int = 2) -> AttentionSpec:
    return AttentionSpec(num_heads=heads, num_kv_heads=kv, head_size=16)


def test_uneven_experts_are_refused_naming_the_sizes_that_work() -> None:
    from transformers import LlamaConfig, MixtralConfig, Qwen3MoeConfig

    six = Qwen3MoeConfig(num_experts=6, num_attention_heads=12, num_key_value_heads=12, intermediate_size=48)
    assert model_experts(six) == 6
    check_ep(3, six, [_spec(12, 12)])
    with pytest.raises(
        UnsupportedConfigError, match=r"4 ranks do not divide the model's 6 experts; sizes that work: 1, 2, 3, 6$"
    ):
        check_ep(4, six, [_spec(12, 12)])
    # Only sizes tensor parallelism also allows are named (4 heads, 2 KV heads: 1 and 2).
    with pytest.raises(UnsupportedConfigError, match=r"3 experts; sizes that work: 1$"):
        check_ep(2, MixtralConfig(num_local_experts=3, intermediate_size=64), [_spec()])
    with pytest.raises(UnsupportedConfigError, match="no routed experts"):
        check_ep(1, LlamaConfig(), [_spec()])


def _tiny_mixtral() -> Any:
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(
        vocab_size=64,
        hidden_size=H,
        intermediate_size=INTER,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def test_shard_experts_keeps_this_rank_s_experts_in_place() -> None:
    model = _tiny_mixtral()
    before = [layer.mlp.experts.gate_up_proj.detach().clone() for layer in model.model.layers]
    down_before = [layer.mlp.experts.down_proj.detach().clone() for layer in model.model.layers]
    shards = shard_experts(model, 1, 2)
    assert shards == {f"layers.{i}.mlp.experts": ExpertShard(4, 2, 4) for i in range(2)}
    for layer, gu, dn in zip(model.model.layers, before, down_before, strict=True):
        experts = layer.mlp.experts
        assert torch.equal(experts.gate_up_proj, gu[2:]) and torch.equal(experts.down_proj, dn[2:])
        assert experts.gate_up_proj.is_contiguous() and experts.num_experts == 2
        assert getattr(experts, EXPERT_SHARD) == ExpertShard(4, 2, 4)


def test_shard_experts_refuses_a_dense_model() -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    model = AutoModelForCausalLM.from_config(
        LlamaConfig(vocab_size=64, hidden_size=H, intermediate_size=INTER, num_hidden_layers=1, num_attention_heads=4)
    )
    with pytest.raises(UnsupportedConfigError, match="no MoE layer"):
        shard_experts(model, 0, 2)


def test_qwen3_moe_s_plan_keeps_its_replicated_norms_whole() -> None:
    from transformers import Qwen3MoeConfig

    from paged_core.parallel.shard import tp_plan

    class Model:
        config = Qwen3MoeConfig()

    plan = tp_plan(Model())
    assert plan["layers.*.self_attn.o_proj"] == "rowwise"
    assert not any("norm" in name for name in plan)  # replicated_with_grad_allreduce: nothing to split
