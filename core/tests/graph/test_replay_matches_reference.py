"""Replayed steps equal the reference backend at every captured size, with new tables and lengths each time."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from paged_core.api import AttentionMetadata, EagerStrategy, GraphCaptureStrategy
from paged_core.graph import CompiledStrategy, GraphRunner, StaticInput
from paged_core.reference import ReferenceBackend

SIZES = [1, 2, 4, 8]
STRATEGIES: dict[str, Callable[[], GraphCaptureStrategy]] = {
    "eager": EagerStrategy,
    "compiled-eager": lambda: CompiledStrategy(backend="eager"),
    "compiled-aot_eager": lambda: CompiledStrategy(backend="aot_eager"),
}


def make_runner(
    g: SimpleNamespace, backend_cls: type, strategy: GraphCaptureStrategy, cache: torch.Tensor
) -> GraphRunner:
    """A runner whose step is ``backend.forward`` over ``cache`` with query/key/value inputs."""
    backend = backend_cls()

    def step(metadata: AttentionMetadata, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return backend.forward(query, key, value, cache, metadata, g.SPEC)

    per_token = [
        StaticInput("query", (g.SPEC.num_heads, g.SPEC.head_size)),
        StaticInput("key", (g.SPEC.num_kv_heads, g.SPEC.head_size)),
        StaticInput("value", (g.SPEC.num_kv_heads, g.SPEC.head_size)),
    ]
    return GraphRunner(
        backend,
        step,
        block_size=g.BLOCK_SIZE,
        max_blocks_per_seq=g.MAX_BLOCKS,
        capture_sizes=SIZES,
        inputs=per_token,
        strategy=strategy,
    )


def batches_per_size(rng: random.Random, decode_only: bool) -> list[tuple[int, list[int]]]:
    """For each size, two batches padding to it (exact fit and smallest fit), so tables change between replays."""
    out = []
    for lo, n in zip([0, *SIZES], SIZES, strict=False):
        for tokens in sorted({n, lo + 1}):
            if decode_only:
                out.append((n, [1] * tokens))
            else:
                rows = rng.randint(1, tokens)
                lens = [1] * rows
                for _ in range(tokens - rows):
                    lens[rng.randrange(rows)] += 1
                lens.sort()  # decodes (length 1) first
                out.append((n, lens))
    return out


def check_against_reference(
    g: SimpleNamespace, backend_cls: type, strategy: GraphCaptureStrategy, decode_only: bool, seed: int = 0
) -> float:
    """Run every batch through the runner and through ReferenceBackend; return the largest output difference."""
    rng = random.Random(seed)
    cache = g.new_cache(seed)
    ref_cache = cache.clone()
    runner = make_runner(g, backend_cls, strategy, cache)
    runner.capture_all()
    assert torch.equal(cache, ref_cache), "capture must not write the KV cache"
    reference = ReferenceBackend()
    worst = 0.0
    for n, query_lens in batches_per_size(rng, decode_only):
        md, inputs = g.random_batch(rng, query_lens)
        before = runner.stats.replays_by_size[n]
        out = runner.run(md, **inputs)
        assert runner.stats.replays_by_size[n] == before + 1
        expected = reference.forward(inputs["query"], inputs["key"], inputs["value"], ref_cache, md, g.SPEC)
        assert out.shape == expected.shape
        worst = max(worst, float((out - expected).abs().max()))
        assert torch.equal(cache, ref_cache), "K/V must land exactly where the reference puts it"
    assert runner.stats.eager_fallbacks == 0
    return worst


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_uniform_decode_replay_matches_reference(g: SimpleNamespace, strategy: str) -> None:
    assert check_against_reference(g, g.VectorBackend, STRATEGIES[strategy](), decode_only=True) < 1e-5


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_any_batch_replay_matches_reference(g: SimpleNamespace, strategy: str) -> None:
    assert check_against_reference(g, g.AnyBackend, STRATEGIES[strategy](), decode_only=False, seed=1) < 1e-5


class StaleBackend:
    """Mixin: remembers the first block table it sees (the capture-time one) and keeps using it."""

    def attention(self, query, kv_cache, metadata, spec):  # type: ignore[no-untyped-def]
        if not hasattr(self, "stale"):
            self.stale = metadata.block_table.clone()
        metadata = AttentionMetadata(**{**vars(metadata), "block_table": self.stale})
        return super().attention(query, kv_cache, metadata, spec)  # type: ignore[misc]


@pytest.mark.parametrize("strategy", ["eager", "compiled-eager"])
def test_a_step_that_caches_the_block_table_is_caught(g: SimpleNamespace, strategy: str) -> None:
    # Same pipeline, same tolerance as above; only the backend's staleness differs, and the comparison sees it.
    stale_cls = type("StaleVector", (StaleBackend, g.VectorBackend), {})
    assert check_against_reference(g, stale_cls, STRATEGIES[strategy](), decode_only=True) > 1e-2
