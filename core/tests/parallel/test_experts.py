"""Expert sharding (which experts a rank keeps, the slices) and the dispatch/combine on two gloo ranks."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_core.contract.capabilities import AttentionSpec
from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.moe import MoERouting, PackedExperts, reference_moe
from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.dispatch import token_slice
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


WORKER = Path(__file__).with_name("ep_dispatch_worker.py")

CASES: list[dict[str, Any]] = [
    {"name": "uneven_top2", "tokens": 37, "experts": E, "top_k": 2, "seed": 1},  # 19 and 18 tokens
    {"name": "top1", "tokens": 23, "experts": E, "top_k": 1, "seed": 2},
    {"name": "top4", "tokens": 19, "experts": E, "top_k": 4, "seed": 3, "renormalize": False},
    {"name": "one_token", "tokens": 1, "experts": E, "top_k": 2, "seed": 4},  # rank 1 holds no token
    {"name": "idle_expert", "tokens": 16, "experts": E, "top_k": 2, "seed": 5, "mask": [2, 5]},
    {"name": "rank1_idle", "tokens": 9, "experts": E, "top_k": 2, "seed": 6, "mask": [4, 5, 6, 7]},
    {"name": "bf16", "tokens": 13, "experts": E, "top_k": 2, "seed": 7, "dtype": "bfloat16"},
    {"name": "no_tokens", "tokens": 0, "experts": E, "top_k": 2, "seed": 9},
    {"name": "four_experts_top4", "tokens": 6, "experts": 4, "top_k": 4, "seed": 8},  # every token on both ranks
]


def _worker_module() -> Any:
    spec = importlib.util.spec_from_file_location("ep_dispatch_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, tuple[torch.Tensor, int]]]:
    """Every case's output on each of two gloo ranks (separate processes), and the rows each rank's experts ran."""
    tmp = tmp_path_factory.mktemp("ep-dispatch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), "2", str(tmp / "init"), str(tmp / f"{r}.pt"), json.dumps(CASES)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=120)[0].decode())
        finally:
            proc.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [torch.load(tmp / f"{r}.pt") for r in range(2)]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_two_ranks_give_one_rank_s_bits(case: dict[str, Any], two_ranks: list[Any]) -> None:
    x, logits, experts, routing = _worker_module().case_inputs(case)
    one = reference_moe(x, logits, experts, routing)
    (out0, rows0), (out1, rows1) = (ranks[case["name"]] for ranks in two_ranks)
    assert out0.dtype == x.dtype and out0.shape == x.shape
    assert torch.equal(out0, one) and torch.equal(out1, one)
    # Each rank's experts ran exactly the (token, slot) pairs that chose them, from both ranks' tokens.
    _, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    owner = ids[:, : routing.top_k] // (routing.num_experts // 2)
    assert (rows0, rows1) == (int((owner == 0).sum()), int((owner == 1).sum()))


def test_the_cases_cover_the_edges() -> None:
    """The cases above are the ones their names say: no token on rank 1, no row for rank 1's experts, an expert
    no token chose (so a test of them cannot pass by missing them)."""
    worker = _worker_module()
    by_name = {c["name"]: worker.case_inputs(c) for c in CASES}
    assert token_slice(1, 1, 2) == slice(1, 1)
    chosen = {
        name: set(torch.sort(lg, dim=-1, descending=True, stable=True).indices[:, : r.top_k].flatten().tolist())
        for name, (_, lg, _, r) in by_name.items()
    }
    assert chosen["rank1_idle"] <= {0, 1, 2, 3}
    assert not chosen["idle_expert"] & {2, 5} and len(chosen["idle_expert"]) == E - 2


def test_one_rank_holding_every_expert_calls_the_backend_s_experts_once() -> None:
    calls = []

    class Ops(FusedOps):
        def experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *rest: Any) -> torch.Tensor:
            calls.append(tuple(ids.shape))
            return super().experts(x, weights, ids, *rest)

    experts = _experts(1)
    routing = MoERouting(E, 2, renormalize=True)
    g = torch.Generator().manual_seed(9)
    x, logits = torch.randn(7, H, generator=g), torch.randn(7, E, generator=g)
    out = expert_parallel_moe(x, logits, experts, routing, expert_range(E, 0, 1), Ops())
    assert calls == [(7, 2)] and torch.equal(out, reference_moe(x, logits, experts, routing))


def test_a_shard_of_another_group_is_refused() -> None:
    shard = expert_range(E, 1, 2)
    with pytest.raises(UnsupportedConfigError, match="expert shard of rank 1 of 2, but this process is no group"):
        expert_parallel_moe(
            torch.zeros(3, H),
            torch.zeros(3, E),
            local_experts(_experts(), shard),
            MoERouting(E, 2, renormalize=True),
            shard,
            FusedOps(),
        )


def test_the_shard_must_match_the_local_experts() -> None:
    with pytest.raises(UnsupportedConfigError, match="8 local experts, the shard holds 4"):
        expert_parallel_moe(
            torch.zeros(1, H),
            torch.zeros(1, E),
            _experts(),
            MoERouting(E, 2, renormalize=True),
            expert_range(E, 0, 2),
            FusedOps(),
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
