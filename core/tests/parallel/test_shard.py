"""Sharding in place: rank r keeps whole heads, and the ranks' partial sums add up to the unsplit layer."""

from __future__ import annotations

import copy
from typing import Any

import torch

from paged_core.parallel.group import TPGroup
from paged_core.parallel.shard import FALLBACK_PLAN, shard_model, tp_plan


class _Group(TPGroup):
    """A rank of a group without processes: the all-reduce is left to the test (identity here)."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(rank, world, "gloo", 1.0, torch.device("cpu"), None)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _tiny() -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        attention_bias=True,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def test_llama_uses_its_own_plan() -> None:
    assert tp_plan(_tiny()) == FALLBACK_PLAN  # transformers' Llama plan is the same seven projections


def test_shards_hold_whole_heads_and_partial_sums_add_up() -> None:
    full = _tiny()
    ranks = [copy.deepcopy(full) for _ in range(2)]
    applied = [shard_model(m, _Group(r, 2)) for r, m in enumerate(ranks)]
    assert applied[0]["layers.0.self_attn.q_proj"] == "colwise" and applied[0]["layers.0.mlp.down_proj"] == "rowwise"
    attn = [m.model.layers[0].self_attn for m in ranks]
    full_attn = full.model.layers[0].self_attn
    # q: rank r holds query heads [2r, 2r+2) (8 dims each); k/v: KV head r, the one those query heads read.
    for r in range(2):
        assert torch.equal(attn[r].q_proj.weight, full_attn.q_proj.weight[16 * r : 16 * (r + 1)])
        assert torch.equal(attn[r].k_proj.weight, full_attn.k_proj.weight[8 * r : 8 * (r + 1)])
        assert torch.equal(attn[r].v_proj.bias, full_attn.v_proj.bias[8 * r : 8 * (r + 1)])
        assert attn[r].q_proj.out_features == 16 and attn[r].o_proj.in_features == 16
    # Row-parallel: the bias is added once (rank 0), and the partial products sum to the whole layer.
    assert attn[0].o_proj.bias is not None and attn[1].o_proj.bias is None
    x = torch.randn(5, 32)
    with torch.no_grad():
        partial = [a.o_proj(x[:, :16] if r == 0 else x[:, 16:]) for r, a in enumerate(attn)]
        assert torch.allclose(partial[0] + partial[1], full_attn.o_proj(x), atol=1e-6)
        mlps = [m.model.layers[0].mlp for m in ranks]
        h = torch.randn(5, 32)
        assert torch.allclose(mlps[0](h) + mlps[1](h), full.model.layers[0].mlp(h), atol=1e-5)
