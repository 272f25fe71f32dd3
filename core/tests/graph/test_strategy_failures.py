"""A backend's strategy is a vendor's code: when it raises, its sizes turn eager (counted), nothing fails.

Also which strategies can serve a declared capture (:func:`paged_core.graph.strategy_problem`).
"""

from __future__ import annotations

from collections.abc import Hashable
from types import SimpleNamespace

import pytest
import torch

from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    ConfigError,
    DeviceGraphStrategy,
    EagerStrategy,
    GraphCaptureStrategy,
    StepFn,
    build_attention_metadata,
)
from paged_core.graph import GraphRunner, StaticInput, strategy_problem


class Flaky(EagerStrategy):
    """Eager replay that raises on ``capture`` or ``replay`` of the sizes in ``bad``."""

    name = "flaky"

    def __init__(self, phase: str, bad: set[int]) -> None:
        super().__init__()
        self.phase, self.bad = phase, bad
        self.replayed: list[Hashable] = []

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        if self.phase == "capture" and key in self.bad:
            raise RuntimeError(f"cannot capture {key}")
        super().capture(key, fn, args)

    def replay(self, key: Hashable) -> torch.Tensor:
        self.replayed.append(key)
        if self.phase == "replay" and key in self.bad:
            raise ValueError(f"cannot replay {key}")
        return super().replay(key)


def _step(metadata: AttentionMetadata, x: torch.Tensor) -> torch.Tensor:
    rows = torch.searchsorted(metadata.query_start_loc[1:].long(), torch.arange(x.shape[0]), right=True)
    return x + metadata.seq_lens.long()[rows.clamp(max=metadata.seq_lens.shape[0] - 1)]


def _runner(g: SimpleNamespace, strategy: GraphCaptureStrategy) -> GraphRunner:
    return GraphRunner(
        g.VectorBackend(),
        _step,
        block_size=4,
        max_blocks_per_seq=3,
        capture_sizes=[1, 2, 4],
        inputs=[StaticInput("x", (), torch.int64)],
        strategy=strategy,
        max_model_len=10,
    )


def _decode(seq_lens: list[int]) -> AttentionMetadata:
    tables = [[b + 1] * 3 for b in range(len(seq_lens))]
    return build_attention_metadata([1] * len(seq_lens), seq_lens, tables, 4, max_blocks_per_seq=3)


@pytest.mark.parametrize(("phase", "error"), [("capture", "RuntimeError"), ("replay", "ValueError")])
def test_a_raising_size_runs_eagerly_counted_and_the_others_still_replay(
    g: SimpleNamespace, phase: str, error: str
) -> None:
    strategy = Flaky(phase, bad={2})
    runner = _runner(g, strategy)
    runner.capture_all()  # a capture that raises is not an error of capture_all
    reason = f"graph strategy {phase} raised {error}"
    for _ in range(3):
        out = runner.run(_decode([5, 7]), x=torch.tensor([10, 20]))
        assert out.tolist() == [15, 27]  # the eager step's answer, every time
    assert runner.stats.fallback_reasons == {reason: 3}
    assert runner.failures == {2: reason}
    assert strategy.replayed.count(2) == (1 if phase == "replay" else 0)  # a failed size is never tried again
    assert runner.run(_decode([3, 4, 5]), x=torch.tensor([1, 1, 1])).tolist() == [4, 5, 6]
    assert runner.stats.replays_by_size == {4: 1}
    done = runner.replay(_decode([5, 7]), x=torch.tensor([10, 20]))
    assert done.output is None and done.reason == reason and done.failed
    not_admitted = runner.replay(build_attention_metadata([2], [2], [[1]], 4, max_blocks_per_seq=3), x=torch.ones(2))
    assert not_admitted.output is None and not not_admitted.failed
    runner.reset()  # a fresh capture may try the size again
    assert runner.failures == {}


def test_a_runner_refuses_a_backend_that_hands_out_no_strategy(g: SimpleNamespace) -> None:
    class NoStrategy(g.VectorBackend):  # type: ignore[misc, name-defined]
        def graph_strategy(self) -> GraphCaptureStrategy:
            return None  # type: ignore[return-value]

    with pytest.raises(ConfigError, match="graph_strategy\\(\\) returned NoneType, not a GraphCaptureStrategy"):
        GraphRunner(NoStrategy(), _step, block_size=4, max_blocks_per_seq=3, capture_sizes=[1])


def test_which_strategies_can_serve_a_declared_capture(g: SimpleNamespace) -> None:
    def backend(base: type, device: str, strategy: object) -> AttentionBackend:
        cls = type("B", (base,), {"graph_strategy": lambda self: strategy() if callable(strategy) else strategy})
        made: AttentionBackend = cls(device=device)
        return made

    assert strategy_problem(backend(g.NeverBackend, "cpu", None)) is None  # nothing declared, nothing promised
    assert strategy_problem(backend(g.VectorBackend, "cpu", EagerStrategy)) is None  # no graph API: the seam
    assert strategy_problem(backend(g.VectorBackend, "cuda", lambda: DeviceGraphStrategy("cuda"))) is None
    eager_gpu = strategy_problem(backend(g.AnyBackend, "cuda", EagerStrategy))
    assert eager_gpu == (
        "backend 'vector-test' declares graph_support=any but graph_strategy() returns EagerStrategy on cuda, "
        "which captures nothing"
    )
    assert "returned NoneType, not a GraphCaptureStrategy" in (
        strategy_problem(backend(g.VectorBackend, "cpu", None)) or ""
    )

    def boom() -> GraphCaptureStrategy:
        raise OSError("kernel library missing")

    raised = strategy_problem(backend(g.VectorBackend, "cpu", boom))
    assert raised is not None and raised.endswith("graph_strategy() raised OSError: kernel library missing")
