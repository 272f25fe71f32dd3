"""The compiled step compiles at warm-up only, never traces a no-capture backend, and matches the eager step.

Dynamo runs with its ``eager`` backend here (no inductor: seconds, not minutes); recompiles and traced
frames are dynamo's, so they are the same under inductor. Three bugs made the tiny Mistral's compiled tests
take ~17 minutes in CI: the reference backend's attention was traced (its ``torch.compiler.disable`` was
chosen by ``is_compiling()``, which is False in the forward frame dynamo runs eagerly after the graph break
in the layer loop), so its row loop was compiled once per token count and row value; the warm-up batches
differed from real steps in what dynamo guards (inference tensors, a one-block table), so the first real
step of each kind recompiled; and duck sizing tied unrelated sizes together (a KV block count equal to
the row budget), so another engine recompiled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from paged_core.contract.capabilities import AttentionSpec
from paged_core.runner.batch import BatchBuilder, RowState, StepBatch
from paged_core.runner.executors import CompiledExecutor, StepExecutor
from paged_core.runner.fused import FusedDecoder
from paged_core.testing import ReferenceBackend

BLOCK, WIDTH, ROWS, TOKENS = 16, 5, 8, 96


def _decoder(backend: ReferenceBackend) -> tuple[FusedDecoder, list[AttentionSpec]]:
    from transformers import AutoModelForCausalLM, MistralConfig

    config = MistralConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=20,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    specs = [AttentionSpec(num_heads=2, num_kv_heads=1, head_size=32, sliding_window=20)]
    return FusedDecoder(model, backend, specs, max_positions=WIDTH * BLOCK), specs


def _step(builder: BatchBuilder, query_lens: list[int], context: int, chunks: int = 0) -> StepBatch:
    """Rows of ``query_lens`` new tokens after ``context`` cached ones, each on blocks of its own.

    The last ``chunks`` rows are prompt chunks (more prompt follows), so they sample nothing.
    """
    scheduled = []
    for i, q in enumerate(query_lens):
        known = context + q + (3 if i >= len(query_lens) - chunks else 0)
        blocks = [1 + i * WIDTH + b for b in range(-(-known // BLOCK))]
        scheduled.append((f"r{i}", RowState([(7 * i + j) % 64 for j in range(known)], [blocks], context), q))
    return builder.build(scheduled)


class WatchedReference(ReferenceBackend):
    """The reference backend, recording whether dynamo was tracing each time its attention ran."""

    def __init__(self) -> None:
        super().__init__()
        self.traced: list[bool] = []

    def attention(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.traced.append(torch.compiler.is_compiling())
        return super().attention(*args, **kwargs)


@pytest.fixture
def graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every graph dynamo hands to the compiler backend (``eager``) from now on."""
    torch._dynamo.reset()
    seen: list[Any] = []
    real_compile = torch.compile

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append(gm)
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": record}))
    yield seen
    torch._dynamo.reset()


@pytest.mark.parametrize("piecewise", [False, True], ids=["whole-step", "pieces"])
def test_no_capture_backend_is_never_traced_and_compiles_at_warm_up_only(graphs: list[Any], piecewise: bool) -> None:
    backend = WatchedReference()
    decoder, specs = _decoder(backend)
    caches = [backend.allocate_kv_cache(ROWS * WIDTH + 1, BLOCK, s, torch.float32) for s in specs]
    compiled = CompiledExecutor(
        decoder, backend, caches, BLOCK, max_num_reqs=ROWS, max_blocks_per_seq=WIDTH, piecewise=piecewise
    )
    eager = StepExecutor(decoder, backend, caches)
    builder = BatchBuilder(TOKENS, ROWS, WIDTH, BLOCK, torch.device("cpu"))  # allocated outside inference mode
    with torch.inference_mode():
        compiled.warm_up()
        warmed = len(graphs)
        # Whole step: the step around the forward and the layer ops, per warm-up shape. Pieces: first and last
        # (this decoder has one layer, so no between piece), for one token and for many.
        assert 0 < warmed <= (4 if piecewise else 16), warmed
        # Every kind of step the scheduler makes: alone or together, prefill, decode, mixed, and prompt chunks
        # that sample nothing (so a step samples 0, 1 or several rows, whatever its row count).
        for query_lens, context, chunks in (
            ([9], 0, 0),
            ([1], 9, 0),
            ([5, 30, 2], 0, 0),
            ([1, 1, 1], 30, 0),
            ([1, 1, 7], 12, 0),
            ([24, 24], 20, 0),
            ([1] * ROWS, 40, 0),
            ([12], 0, 1),
            ([1], 4, 1),
            ([1, 9], 8, 1),
            ([6, 9], 8, 2),
            ([1, 1, 9], 8, 1),
        ):
            batch = _step(builder, query_lens, context, chunks)
            want = eager.run(batch).clone()
            got = compiled.run(batch)
            assert got.shape[0] == len(query_lens) - chunks
            assert compiled.stats.piece_replays == (compiled.stats.steps if piecewise else 0)
            torch.testing.assert_close(got, want, msg=lambda m, q=query_lens: f"{q}: {m}")
    assert len(graphs) == warmed, "a real step recompiled the warmed-up step"
    # Another engine on the same weights shares the compiled step, whatever its sizes; here its block count
    # equals its row budget (duck sizing once tied the two, so every other block count recompiled).
    other = [backend.allocate_kv_cache(24, BLOCK, s, torch.float32) for s in specs]
    with torch.inference_mode():
        CompiledExecutor(
            decoder, backend, other, BLOCK, max_num_reqs=24, max_blocks_per_seq=WIDTH, piecewise=piecewise
        ).warm_up()
    assert len(graphs) == warmed, "a second engine recompiled the shared step"
    assert backend.traced and not any(backend.traced), "dynamo traced the reference backend's attention"


@pytest.mark.parametrize("piecewise", [False, True], ids=["whole-step", "pieces"])
def test_verify_steps_of_speculative_decoding_reuse_the_warmed_up_step(graphs: list[Any], piecewise: bool) -> None:
    # Rows that verify drafts sample every position they run (1 + k logits rows): the logits count then
    # equals the token count, which no warm-up batch has; dynamic shapes must still cover it.
    backend = ReferenceBackend()
    decoder, specs = _decoder(backend)
    caches = [backend.allocate_kv_cache(ROWS * WIDTH + 1, BLOCK, s, torch.float32) for s in specs]
    compiled = CompiledExecutor(
        decoder, backend, caches, BLOCK, max_num_reqs=ROWS, max_blocks_per_seq=WIDTH, piecewise=piecewise
    )
    eager = StepExecutor(decoder, backend, caches)
    builder = BatchBuilder(TOKENS, ROWS, WIDTH, BLOCK, torch.device("cpu"))
    with torch.inference_mode():
        compiled.warm_up()
        warmed = len(graphs)
        for drafts_per_row, context in (([3], 10), ([1], 5), ([3, 3, 3], 20), ([0, 2, 4], 12), ([4] * ROWS, 30)):
            scheduled, drafts = [], {}
            for i, k in enumerate(drafts_per_row):
                blocks = [1 + i * WIDTH + b for b in range(-(-(context + 1 + k) // BLOCK))]
                row = RowState([(5 * i + j) % 64 for j in range(context + 1)], [blocks], context)
                scheduled.append((f"r{i}", row, 1 + k))
                drafts[f"r{i}"] = [(3 * i + j) % 64 for j in range(k)]
            batch = builder.build(scheduled, drafts)
            assert batch.sample_counts == [1 + k for k in sorted(drafts_per_row, key=lambda k: k != 0)]
            want = eager.run(batch).clone()
            got = compiled.run(batch)
            assert got.shape[0] == sum(1 + k for k in drafts_per_row)
            torch.testing.assert_close(got, want, msg=lambda m, d=drafts_per_row: f"{d}: {m}")
    assert len(graphs) == warmed, "a verify step recompiled the warmed-up step"
