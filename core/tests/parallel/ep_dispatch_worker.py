"""One rank of the expert-parallel dispatch tests (test_experts.py starts two on a gloo loopback group).

``python ep_dispatch_worker.py RANK WORLD INIT_FILE OUT CASES_JSON``: joins the group, runs
:func:`expert_parallel_moe` on every case's inputs (:func:`case_inputs`, the same on every rank, as tensor
parallelism gives them) with this rank's experts, and saves ``{case: (output, rows its experts computed)}`` to
``OUT``. The test imports :func:`case_inputs` from this file for the one-rank result.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.moe import Activation, MoERouting, PackedExperts

H, INTER = 32, 16


def case_inputs(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, PackedExperts, MoERouting]:
    """``(x, router_logits, all experts, routing)`` of a case: seeded; ``mask`` experts are never chosen."""
    experts, tokens = int(case["experts"]), int(case["tokens"])
    g = torch.Generator().manual_seed(int(case["seed"]))
    gate_up = torch.randn(experts, 2 * INTER, H, generator=g) * 0.3
    down = torch.randn(experts, H, INTER, generator=g) * 0.3
    x = torch.randn(tokens, H, generator=g).to(getattr(torch, case.get("dtype", "float32")))
    logits = torch.randn(tokens, experts, generator=g)
    for e in case.get("mask", []):
        logits[:, e] = -100.0
    routing = MoERouting(experts, int(case["top_k"]), renormalize=bool(case.get("renormalize", True)))
    return x, logits, PackedExperts(gate_up, down), routing


class RecordingOps(FusedOps):
    """The reference ops, recording what reaches ``experts``: dispatched rows come one slot each, weight 1, fp32."""

    def __init__(self) -> None:
        self.rows = 0

    def experts(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        experts: PackedExperts,
        activation: Activation = "silu",
    ) -> torch.Tensor:
        assert x.dtype == torch.float32 and ids.shape == (x.shape[0], 1), (x.dtype, tuple(ids.shape))
        assert torch.equal(weights, torch.ones_like(weights))
        self.rows += x.shape[0]
        return super().experts(x, weights, ids, experts, activation)


def main(rank: int, world: int, init_file: str, out: str, cases: list[dict[str, Any]]) -> None:
    import torch.distributed as dist

    from paged_core.parallel.experts import expert_parallel_moe, expert_range, local_experts

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    try:
        for case in cases:
            x, logits, experts, routing = case_inputs(case)
            shard = expert_range(routing.num_experts, rank, world)
            ops = RecordingOps()
            y = expert_parallel_moe(x, logits, local_experts(experts, shard), routing, shard, ops)
            results[case["name"]] = (y, ops.rows)
    finally:
        dist.destroy_process_group()
    torch.save(results, out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))
