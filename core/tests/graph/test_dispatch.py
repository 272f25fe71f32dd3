"""GraphRunner's decisions: when it replays, when it falls back, and what the step sees."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paged_core.api import AttentionMetadata, ConfigError, EagerStrategy, build_attention_metadata
from paged_core.graph import GraphRunner, StaticInput


class Recorder:
    """A step that records the host ints it is given and returns ``x + seq_len of the token's row``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, int]] = []

    def __call__(self, metadata: AttentionMetadata, x: torch.Tensor) -> torch.Tensor:
        self.seen.append({k: v for k, v in vars(metadata).items() if isinstance(v, int)})
        rows = torch.searchsorted(metadata.query_start_loc[1:].long(), torch.arange(x.shape[0]), right=True)
        return x + metadata.seq_lens.long()[rows.clamp(max=metadata.seq_lens.shape[0] - 1)]


def make(g: SimpleNamespace, backend_cls: type, sizes: list[int] = [1, 2, 4]) -> tuple[GraphRunner, Recorder]:  # noqa: B006
    step = Recorder()
    runner = GraphRunner(
        backend_cls(),
        step,
        block_size=4,
        max_blocks_per_seq=3,
        capture_sizes=sizes,
        inputs=[StaticInput("x", (), torch.int64)],
        strategy=EagerStrategy(),
        max_model_len=10,
    )
    return runner, step


def batch(query_lens: list[int], seq_lens: list[int], width: int = 3) -> AttentionMetadata:
    tables = [[b + 1] * width for b in range(len(query_lens))]
    return build_attention_metadata(query_lens, seq_lens, tables, 4, max_blocks_per_seq=width)


def test_uniform_decode_replays_decodes_and_pads(g: SimpleNamespace) -> None:
    runner, step = make(g, g.VectorBackend)
    runner.capture_all()
    out = runner.run(batch([1, 1, 1], [5, 7, 2]), x=torch.tensor([10, 20, 30]))
    assert out.tolist() == [15, 27, 32]  # sliced to the 3 real tokens, computed with the real seq_lens
    assert runner.stats.replays == 1 and runner.stats.replays_by_size[4] == 1
    assert step.seen[-1] == {
        "block_size": 4,
        "num_decodes": 4,
        "num_decode_tokens": 4,
        "num_prefills": 0,
        "num_actual_tokens": 4,
        "max_query_len": 1,
        "max_seq_len": 10,
        "uniform_query_len": 1,
    }


def test_uniform_decode_falls_back_for_prefill(g: SimpleNamespace) -> None:
    runner, step = make(g, g.VectorBackend)
    runner.capture_all()
    md = batch([1, 2], [3, 2])
    out = runner.run(md, x=torch.tensor([1, 2, 3]))
    assert out.tolist() == [4, 4, 5]
    assert runner.stats.replays == 0 and runner.stats.fallback_reasons == {"not a uniform decode batch": 1}
    assert step.seen[-1]["num_prefills"] == 1  # the eager call got the real metadata


def test_any_replays_prefill_with_conservative_ints(g: SimpleNamespace) -> None:
    runner, step = make(g, g.AnyBackend)
    runner.capture_all()
    out = runner.run(batch([1, 2], [3, 2]), x=torch.tensor([1, 2, 3]))
    assert out.tolist() == [4, 4, 5]
    assert runner.stats.replays_by_size[4] == 1
    assert step.seen[-1]["num_decodes"] == 0 and step.seen[-1]["max_query_len"] == 4
    assert step.seen[-1]["uniform_query_len"] == 0


def test_never_is_always_eager_and_captures_nothing(g: SimpleNamespace) -> None:
    runner, step = make(g, g.NeverBackend)
    runner.capture_all()
    assert step.seen == [] and not runner.strategy.has(1)
    runner.run(batch([1], [2]), x=torch.tensor([0]))
    assert runner.stats.fallback_reasons == {"backend graph_support is never": 1}


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "width", "reason"),
    [
        ([1] * 5, [1] * 5, 3, "more tokens than the largest capture size"),
        ([1], [2], 4, "block table wider than max_blocks_per_seq"),
        ([1], [11], 3, "max_seq_len above max_model_len"),
    ],
)
def test_fallback_reasons(
    g: SimpleNamespace, query_lens: list[int], seq_lens: list[int], width: int, reason: str
) -> None:
    runner, _ = make(g, g.AnyBackend)
    runner.capture_all()
    md = build_attention_metadata(query_lens, seq_lens, [[1] * width] * len(query_lens), 4, max_blocks_per_seq=width)
    runner.run(md, x=torch.zeros(len(query_lens), dtype=torch.int64))
    assert runner.stats.fallback_reasons == {reason: 1} and runner.stats.replays == 0


def test_other_block_size_falls_back(g: SimpleNamespace) -> None:
    runner, _ = make(g, g.VectorBackend)
    runner.capture_all()
    md = build_attention_metadata([1], [3], [[1, 2, 3]], 2, max_blocks_per_seq=3)
    runner.run(md, x=torch.zeros(1, dtype=torch.int64))
    assert runner.stats.fallback_reasons == {"block size differs from the captured one": 1}


def test_a_strategy_captured_elsewhere_is_still_usable(g: SimpleNamespace) -> None:
    runner, _ = make(g, g.VectorBackend)
    runner.capture_all()
    again = GraphRunner(
        g.VectorBackend(),
        Recorder(),
        block_size=4,
        max_blocks_per_seq=3,
        capture_sizes=[1, 2, 4],
        inputs=[StaticInput("x", (), torch.int64)],
        strategy=runner.strategy,
        max_model_len=10,
    )
    again.capture_all()
    again.run(batch([1], [3]), x=torch.tensor([1]))
    assert again.stats.replays == 1


def test_not_captured_until_capture_all_and_after_reset(g: SimpleNamespace) -> None:
    runner, _ = make(g, g.VectorBackend)
    md = batch([1], [2])
    runner.run(md, x=torch.tensor([0]))
    runner.capture_all()
    runner.run(md, x=torch.tensor([0]))
    runner.reset()
    runner.run(md, x=torch.tensor([0]))
    assert runner.stats.replays == 1 and runner.stats.fallback_reasons == {"size not captured": 2}


def test_warm_up_and_prepare(g: SimpleNamespace) -> None:
    runner, step = make(g, g.VectorBackend, sizes=[2, 1])
    runner.capture_all()
    # Largest first; per size: 2 warm-up calls plus EagerStrategy's capture (which records, not runs).
    assert [s["num_actual_tokens"] for s in step.seen] == [2, 2, 1, 1]
    backend = runner.backend
    assert [m.num_tokens for m in backend.prepared] == [2, 1]
    runner.run(batch([1], [2]), x=torch.tensor([0]))
    assert backend.prepared[-1] is runner._static_metadata[1]  # prepare saw the static metadata, outside the graph


def test_constructor_errors(g: SimpleNamespace) -> None:
    with pytest.raises(ConfigError, match="capture_sizes"):
        GraphRunner(g.VectorBackend(), Recorder(), block_size=4, max_blocks_per_seq=2, capture_sizes=[])
    with pytest.raises(ConfigError, match="block_size"):
        GraphRunner(g.VectorBackend(), Recorder(), block_size=0, max_blocks_per_seq=2, capture_sizes=[1])
