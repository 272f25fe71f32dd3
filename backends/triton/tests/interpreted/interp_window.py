"""Sliding windows and logits soft caps in the attention kernels, against the core reference (interpreter only).

Every windowed check poisons what a windowed row must never read: the blocks wholly before the window of
its first query hold NaN (an int8/fp8 cache: NaN scales) and their block-table entries are the null block,
the row's own old block or another row's block. A kernel that reads one gets NaN, which fails the check.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_cases import TOL, run_case

from paged_core.api import AttentionSpec, build_attention_metadata
from paged_core.testing import ReferenceBackend
from paged_triton.tiles import INTERPRET_TILES_ENV

GEMMA2_SOFT_CAP = 50.0
"""Gemma 2's attention logits soft cap."""
Q_GAIN = 12.0
"""Query scale of the mixed batch: scores reach about the cap, so the cap changes the output."""


@pytest.mark.parametrize(("family", "dtype"), [("cdna", torch.float32), ("xpu", torch.bfloat16)], ids=str)
def test_window_and_soft_cap_mixed_batch(monkeypatch: pytest.MonkeyPatch, family: str, dtype: torch.dtype) -> None:
    """Decodes, a chunk over cached context and a fresh prompt, with a window not aligned to blocks and
    Gemma 2's soft cap on large scores; the blocks before each window are poisoned."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, family)
    run_case(
        dtype,
        dtype,
        4,
        2,
        64,
        16,
        [1, 1, 9, 24],
        [75, 5, 60, 24],
        window=21,
        soft_cap=GEMMA2_SOFT_CAP,
        poisoned=True,
        kernel_write=False,
        q_gain=Q_GAIN,
    ).check()


@pytest.mark.parametrize("window", [1, 16, 17, 200])
def test_window_edges(window: int) -> None:
    """Only the query itself (1), a window of exactly one block, one key past a block, and one longer than
    every sequence (no effect), with the interpreter's own large tiles."""
    run_case(
        torch.float32,
        torch.float32,
        2,
        1,
        64,
        16,
        [1, 1, 6, 18],
        [49, 16, 38, 18],
        window=window,
        poisoned=True,
        kernel_write=False,
    ).check()


@pytest.mark.parametrize(("family", "window", "soft_cap"), [("cdna", 1000, 30.0), ("xpu", 300, None)])
def test_window_split_k_decode(
    monkeypatch: pytest.MonkeyPatch, family: str, window: int, soft_cap: float | None
) -> None:
    """Long decode rows split into partitions of the window's span only (300 keys: two partitions from the
    window's start; 1000: several), with the blocks before the windows poisoned."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, family)
    run_case(
        torch.float32,
        torch.float32,
        8,
        1,
        64,
        64,
        [1, 1, 1],
        [1100, 1290, 70],
        window=window,
        soft_cap=soft_cap,
        poisoned=True,
        kernel_write=False,
        q_gain=4.0,
    ).check()


def test_soft_cap_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small cap (every score squashed) without a window, fp16, GQA 4, an explicit scale."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, "cdna")
    run_case(
        torch.float16,
        torch.float16,
        8,
        2,
        128,
        32,
        [1, 12],
        [40, 30],
        scale=0.3,
        soft_cap=2.0,
        q_gain=2.0,
        kernel_write=False,
    ).check()


@pytest.mark.parametrize(("window", "seq_lens"), [(33, [70, 24]), (280, [400, 24])])
def test_rdna_tiles_window_soft_cap_quantized(
    monkeypatch: pytest.MonkeyPatch, window: int, seq_lens: list[int]
) -> None:
    """RDNA's tiles (q.k over two head-dim chunks; 16-key tiles for a quantized cache) with a window, a soft cap
    and an int8 cache, poisoned before the windows; the long window splits its decode row (split-K)."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, "rdna")
    run_case(
        torch.bfloat16,
        torch.int8,
        4,
        2,
        128,
        16,
        [1, 7],
        seq_lens,
        window=window,
        soft_cap=GEMMA2_SOFT_CAP,
        poisoned=True,
        kernel_write=False,
        q_gain=4.0,
    ).check()


@pytest.mark.parametrize("feature", ["window", "soft_cap"])
def test_the_features_matter_in_these_batches(feature: str) -> None:
    """The window and the soft cap of the checks above change the reference's output far beyond the tolerance,
    so a kernel ignoring either would fail them."""
    gen = torch.Generator().manual_seed(7)
    spec = AttentionSpec(4, 2, 64, sliding_window=21, logits_soft_cap=GEMMA2_SOFT_CAP)
    plain = dataclasses.replace(spec, **{"sliding_window" if feature == "window" else "logits_soft_cap": None})
    seq_lens, query_lens, block = [75, 5, 60, 24], [1, 1, 9, 24], 16
    rows, start = [], 1
    for s in seq_lens:
        rows.append(list(range(start, start + -(-s // block))))
        start += len(rows[-1])
    ref = ReferenceBackend("cpu")
    cache = ref.allocate_kv_cache(start, block, spec, torch.float32)
    ref.write_kv(
        torch.randn(sum(seq_lens), 2, 64, generator=gen),
        torch.randn(sum(seq_lens), 2, 64, generator=gen),
        cache,
        build_attention_metadata(seq_lens, seq_lens, rows, block),
    )
    step = build_attention_metadata(query_lens, seq_lens, rows, block)
    q = Q_GAIN * torch.randn(sum(query_lens), 4, 64, generator=gen)
    want, other = ref.attention(q, cache, step, spec), ref.attention(q, cache, step, plain)
    moved = float(((want - other).abs() / (1.0 + want.abs())).max())
    assert moved > 3 * TOL[torch.bfloat16], f"{feature} moves the output by only {moved}"
