"""Expert parallel 2 gives expert parallel 1's greedy streams token for token on the tiny MoE models (fp32).

Each rank holds half of every MoE layer's experts; each routes its half of the step's tokens, sends every
(token, slot) pair to the rank holding its expert and gets the product back by all-to-all, combines its tokens
and all-gathers (:mod:`paged_core.parallel.experts`). Against tensor parallel 2 without expert parallelism (the
same attention split, every expert on every rank, the backend's ``moe``) the logits are bitwise equal: each
expert gets the same rows in the same order from the backend's ``experts``, and the combine is the one-rank
arithmetic. Against one process the logits differ only by the attention's all-reduce (as tensor parallel's).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_core import LLM, SamplingParams
from paged_core.parallel.experts import ExpertShard

from .ep_helpers import MOE_ARCHS, save_tiny_moe
from .tp_helpers import ENGINE, worker_pids, workload

pytestmark = pytest.mark.serial  # two ranks, each with its share of every core


def _battery() -> tuple[list[list[int]], list[SamplingParams]]:
    """Twelve of the tensor-parallel workload's prompts (shared prefixes, n=2 forks, chunked prefills)."""
    prompts, params = workload()
    return prompts[:12], params[:12]


def _logits_per_step(llm: LLM) -> tuple[list[list[list[int]]], list[torch.Tensor]]:
    """The battery's token streams and every step's logits ``[K, V]`` as rank 0's runner returned them."""
    runner = llm.engine.core.runner
    seen: list[torch.Tensor] = []
    execute = runner.execute

    def spy(out: Any) -> Any:
        ids, counts, logits = execute(out)
        if logits is not None:
            seen.append(logits.detach().clone())
        return ids, counts, logits

    runner.execute = spy  # type: ignore[method-assign]
    try:
        outs = llm.generate(*_battery(), use_tqdm=False)
    finally:
        del runner.execute
    assert all(o.error is None for o in outs)
    return [[c.token_ids for c in o.outputs] for o in outs], seen


@pytest.fixture(scope="module", params=MOE_ARCHS)
def arch_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_moe(str(request.param), tmp_path_factory.mktemp("ep"))


@pytest.fixture(scope="module")
def runs(arch_dir: Path) -> Iterator[dict[str, tuple[list[list[list[int]]], list[torch.Tensor]]]]:
    """The battery on one process, on tensor parallel 2, and on tensor parallel 2 with expert parallelism."""
    found = {}
    for name, extra in (
        ("one", {}),
        ("tp2", {"tensor_parallel_size": 2}),
        ("ep2", {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
    ):
        with LLM(str(arch_dir), model_impl="fused", **ENGINE, **extra) as llm:
            if name == "ep2":
                _check_rank0_holds_half(llm)
                calls = _spy_experts(llm)
            found[name] = _logits_per_step(llm)
        assert worker_pids() == [], "closing the engine left a worker behind"
    # Rank 0's experts ran through the backend's op, on dispatched rows: one slot each, float32.
    assert calls and all(c == (1, torch.float32) for c in calls), calls[:5]
    yield found


def _spy_experts(llm: LLM) -> list[tuple[int, torch.dtype]]:
    """Record ``(k, dtype)`` of each call of rank 0's backend ``experts`` (the instance the decoder holds)."""
    ops = llm.engine.core.runner.forward_impl.ops
    experts, calls = ops.experts, []

    def spy(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *rest: Any) -> torch.Tensor:
        calls.append((int(ids.shape[1]), x.dtype))
        return experts(x, weights, ids, *rest)

    ops.experts = spy
    return calls


def _check_rank0_holds_half(llm: LLM) -> None:
    decoder = llm.engine.core.runner.forward_impl
    moes = [layer.moe for layer in decoder.layers if layer.moe is not None]
    assert moes
    for moe in moes:
        total = moe.routing.num_experts
        assert moe.shard == ExpertShard(total, 0, total // 2)
        assert moe.experts.num_experts == total // 2


def test_expert_parallel_2_streams_equal_one_process(runs: dict[str, Any]) -> None:
    (one, one_logits), (ep2, ep2_logits) = runs["one"], runs["ep2"]
    assert ep2 == one
    assert len(ep2_logits) == len(one_logits) > 10  # the same schedule, step for step
    worst = max(float((a - b).abs().max()) for a, b in zip(one_logits, ep2_logits, strict=True))
    scale = max(float(a.abs().max()) for a in one_logits)
    print(f"EP2 vs one process: max |logit difference| {worst:.2e} (largest |logit| {scale:.1f})")
    assert worst < 1e-5 * max(1.0, scale)


def test_expert_parallel_logits_are_tensor_parallel_s_bit_for_bit(runs: dict[str, Any]) -> None:
    (tp2, tp2_logits), (ep2, ep2_logits) = runs["tp2"], runs["ep2"]
    assert ep2 == tp2
    for a, b in zip(tp2_logits, ep2_logits, strict=True):
        assert torch.equal(a, b)
