"""The CUDA kernels' own source, compiled for the CPU (:mod:`paged_backend_cuda.emulated`), against the reference.

Every attention case fills the whole cache with random values and scatters the rows' blocks, so a key read
from the wrong block, position or head changes the output. The library is built once per source hash (~10 s).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_backend_cuda import build, emulated
from paged_core.api import AttentionMetadata, AttentionSpec, build_attention_metadata
from paged_core.testing import ReferenceBackend

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which(os.environ.get("CXX") or "g++") is None,
    reason="needs Linux (ucontext) and a C++ compiler ($CXX or g++)",
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOLERANCE = {F32: 2e-5, BF16: 1.6e-2, F16: 2e-3}
"""atol = rtol per output dtype: both sides sum in fp32 and round once at the end."""
REF = ReferenceBackend()

Launches = list[dict[str, int]]


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    """Build (or find) the emulated library before the first test, so no test's time includes the build."""
    emulated.load()


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    """The (first_row, num_rows, rows_per_tile, num_splits) of every emulated attention launch of the test."""
    seen: Launches = []
    real = emulated.attention_op

    def spy(*args: Any) -> None:
        bound = inspect.signature(real).bind(*args).arguments
        seen.append({k: int(bound[k]) for k in ("first_row", "num_rows", "rows_per_tile", "num_splits")})
        real(*args)

    monkeypatch.setattr(emulated, "attention_op", spy)
    return seen


def tables_for(seq_lens: Sequence[int], block_size: int, gen: torch.Generator) -> tuple[list[list[int]], int]:
    """Each row's blocks, scattered over a cache with spare blocks (and block 0, the null block, unused)."""
    needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(needed) + 4
    pool = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables, at = [], 0
    for n in needed:
        tables.append(pool[at : at + n])
        at += n
    return tables, num_blocks


def make_case(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    spec: AttentionSpec,
    block_size: int,
    dtype: torch.dtype,
    query_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A random query ``[T, H, D]``, a random cache and the batch's metadata (decode rows first)."""
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = tables_for(seq_lens, block_size, gen)
    width = max(len(t) for t in tables) + 2  # entries past a row's blocks are 0: a read there hits random keys
    metadata = build_attention_metadata(query_lens, seq_lens, tables, block_size, max_blocks_per_seq=width)
    cache = torch.randn(2, num_blocks, block_size, spec.num_kv_heads, spec.head_size, generator=gen).to(dtype)
    query = torch.randn(sum(query_lens), spec.num_heads, spec.head_size, generator=gen).to(query_dtype or dtype)
    return query, cache, metadata


def check_attention(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    spec: AttentionSpec,
    block_size: int,
    dtype: torch.dtype,
    query_dtype: torch.dtype | None = None,
    sm_count: int = emulated.SM_COUNT,
    prepare: Callable[[AttentionMetadata], AttentionMetadata] = lambda m: m,
) -> None:
    """The emulated kernels' output equals the reference backend's for this batch."""
    query, cache, metadata = make_case(query_lens, seq_lens, spec, block_size, dtype, query_dtype)
    before = cache.clone()
    out = emulated.attention(query, cache, prepare(metadata), spec, sm_count=sm_count)
    expected = REF.attention(query, cache, metadata, spec)
    assert out.dtype == query.dtype and out.shape == query.shape
    tol = max(TOLERANCE[dtype], TOLERANCE[query.dtype])
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    assert torch.equal(cache, before)


DECODE_SEQ_LENS = [1, 17, 64, 130]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_size", "block_size", "dtype", "tile"),
    [
        (4, 4, 64, 16, F32, 1),  # MHA: one row per tile
        (8, 2, 80, 64, BF16, 4),  # GQA 4: a tile per KV head; 80 leaves lanes 20-31 idle
        (8, 1, 256, 16, F16, 8),  # GQA 8
        (12, 2, 256, 16, F32, 8),  # GQA 6: partial 8-row tiles; fp32 at 256 takes two keys per step
        (6, 3, 64, 16, BF16, 4),  # GQA 2: half-empty 4-row tiles
        (16, 1, 64, 64, F32, 8),  # GQA 16: two tiles per KV head
    ],
)
def test_decode(
    launches: Launches,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    tile: int,
) -> None:
    """Decode rows (seq_len 1 to 130) for GQA 1/4/8/6/2/16: one unsplit launch with the group's tile."""
    spec = AttentionSpec(num_heads, num_kv_heads, head_size)
    check_attention([1] * 4, DECODE_SEQ_LENS, spec, block_size, dtype)
    assert launches == [{"first_row": 0, "num_rows": 4, "rows_per_tile": tile, "num_splits": 1}]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "dtype", "sm_count", "split"),
    [
        (8, 8, F32, emulated.SM_COUNT, True),
        (16, 2, BF16, emulated.SM_COUNT, True),
        (16, 2, BF16, 1, False),  # the same batch unsplit: one SM is full already
    ],
)
def test_decode_split(
    launches: Launches, num_heads: int, num_kv_heads: int, dtype: torch.dtype, sm_count: int, split: bool
) -> None:
    """Long decode contexts split into key ranges, then reduce; a 5-key row leaves most of its splits empty."""
    spec = AttentionSpec(num_heads, num_kv_heads, 64)
    check_attention([1, 1, 1], [700, 1100, 5], spec, 16, dtype, sm_count=sm_count)
    assert (launches[0]["num_splits"] > 1) == split


def test_decode_split_at_graph_bound(launches: Launches) -> None:
    """A graph freezes max_seq_len at the model's bound: splits past every row's length reduce to nothing."""
    spec = AttentionSpec(8, 2, 80, sliding_window=100, logits_soft_cap=2.0)
    bound = lambda m: dataclasses.replace(m, max_seq_len=8192)  # noqa: E731
    check_attention([1, 1, 1], [40, 300, 333], spec, 16, F16, prepare=bound)
    assert launches[0]["num_splits"] >= 16


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "head_size", "block_size", "dtype"),
    [
        ([17, 40], [17, 40], 64, 16, F32),  # whole prompts
        ([9, 33], [59, 133], 256, 64, BF16),  # after a cached prefix (context 50 and 100)
        ([2, 5], [2, 75], 80, 16, F16),  # a two-token row; a short chunk after a long prefix
    ],
)
def test_prefill(
    launches: Launches,
    query_lens: list[int],
    seq_lens: list[int],
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
) -> None:
    """Prefill rows, with and without cached context: one launch of eight-row tiles."""
    check_attention(query_lens, seq_lens, AttentionSpec(8, 2, head_size), block_size, dtype)
    assert launches == [{"first_row": 0, "num_rows": 2, "rows_per_tile": 8, "num_splits": 1}]


@pytest.mark.parametrize("head_size", [64, 80, 96, 112, 128, 160, 192, 256])
def test_head_sizes(head_size: int) -> None:
    """Every compiled head size (launch.h's kHeadSizes), on a decode and a prefill row with context."""
    check_attention([1, 6], [50, 29], AttentionSpec(4, 2, head_size), 16, BF16)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "decode_seq_lens", "tile", "split"),
    [(4, 4, [5, 70, 200], 1, False), (12, 2, [5, 70, 200], 8, False), (8, 2, [600, 1000, 30], 4, True)],
)
def test_mixed_batch(
    launches: Launches, num_heads: int, num_kv_heads: int, decode_seq_lens: list[int], tile: int, split: bool
) -> None:
    """Decodes then prefills (one with a cached prefix): a decode launch, split for long contexts (its partials
    then cover only the decode tokens, fewer than the batch's), then a prefill launch from row 3."""
    spec = AttentionSpec(num_heads, num_kv_heads, 64)
    check_attention([1, 1, 1, 3, 20], [*decode_seq_lens, 3, 65], spec, 16, F16)
    assert [(x["first_row"], x["num_rows"], x["rows_per_tile"]) for x in launches] == [(0, 3, tile), (3, 2, 8)]
    assert (launches[0]["num_splits"] > 1) == split


@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec(8, 2, 64, sliding_window=1),  # each token sees only itself
        AttentionSpec(8, 2, 64, sliding_window=24),  # narrower than the context: whole blocks drop out
        AttentionSpec(8, 2, 64, logits_soft_cap=1.5),
        AttentionSpec(8, 2, 64, scale=0.7),
        AttentionSpec(8, 8, 80, scale=0.05, sliding_window=40, logits_soft_cap=3.0),
    ],
    ids=["window1", "window24", "soft_cap", "scale", "all_three"],
)
def test_spec_options(spec: AttentionSpec) -> None:
    """Sliding window, soft cap and an explicit scale, on decode and prefill rows with cached context."""
    check_attention([1, 1, 9, 30], [3, 90, 60, 30], spec, 16, F32)


@pytest.mark.parametrize(("query_dtype", "cache_dtype"), [(F32, BF16), (BF16, F32), (F16, BF16)])
def test_query_dtype_differs(query_dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """A query of another dtype than the cache is computed in the cache's and returned in its own."""
    check_attention([1, 1, 12], [30, 80, 40], AttentionSpec(8, 2, 64), 16, cache_dtype, query_dtype=query_dtype)


def test_strided_views() -> None:
    """Query, key and value as views of one fused qkv projection (strided rows), and a transposed query."""
    spec = AttentionSpec(8, 2, 64)
    h, kv, d = spec.num_heads, spec.num_kv_heads, spec.head_size
    query_lens, seq_lens = [1, 7], [20, 40]
    _, cache, metadata = make_case(query_lens, seq_lens, spec, 16, BF16)
    qkv = torch.randn(sum(query_lens), h + 2 * kv, d, generator=torch.Generator().manual_seed(1)).to(BF16)
    query, key, value = qkv[:, :h], qkv[:, h : h + kv], qkv[:, h + kv :]
    assert not query.is_contiguous() and not key.is_contiguous()
    mine, theirs = cache.clone(), cache.clone()
    emulated.write_kv(key, value, mine, metadata.slot_mapping)
    REF.write_kv(key, value, theirs, metadata)
    assert torch.equal(mine, theirs)
    expected = REF.attention(query, theirs, metadata, spec)
    for q in (query, query.transpose(0, 2).contiguous().transpose(0, 2)):  # the second: last dim not contiguous
        torch.testing.assert_close(emulated.attention(q, mine, metadata, spec), expected, atol=1.6e-2, rtol=1.6e-2)


def test_graph_padded_any_batch(launches: Launches) -> None:
    """An ANY graph's batch: 16 token and row slots holding 3 real rows (7 tokens); padding tokens have slot -1
    and non-zero inputs, trailing rows are empty, host ints are the conservative ones. The real tokens' outputs
    are right and the cache holds exactly what the real tokens wrote."""
    spec = AttentionSpec(12, 2, 80)
    n, query_lens, seq_lens = 16, [1, 1, 5], [9, 40, 21]
    real_tokens = sum(query_lens)
    gen = torch.Generator().manual_seed(2)
    query, cache, real = make_case(query_lens, seq_lens, spec, 16, F32)
    padded = dataclasses.replace(
        real,
        query_start_loc=torch.tensor([0, 1, 2] + [real_tokens] * (n - 2), dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens + [0] * (n - 3), dtype=torch.int32),
        block_table=torch.cat([real.block_table, torch.zeros(n - 3, real.block_table.shape[1], dtype=torch.int32)]),
        slot_mapping=torch.cat([real.slot_mapping, torch.full((n - real_tokens,), -1, dtype=torch.int64)]),
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=n,
        num_actual_tokens=n,
        max_query_len=n,
        max_seq_len=4096,
        uniform_query_len=0,
    )
    key, value = (torch.randn(n, 2, 80, generator=gen) for _ in range(2))
    query = torch.cat([query, torch.randn(n - real_tokens, 12, 80, generator=gen)])
    mine, theirs = cache.clone(), cache.clone()
    emulated.write_kv(key, value, mine, padded.slot_mapping)
    REF.write_kv(key[:real_tokens], value[:real_tokens], theirs, real)
    assert torch.equal(mine, theirs)
    out = emulated.attention(query, mine, padded, spec)
    expected = REF.attention(query[:real_tokens], theirs, real, spec)
    torch.testing.assert_close(out[:real_tokens], expected, atol=2e-5, rtol=2e-5)
    assert torch.equal(mine, theirs)
    assert launches == [{"first_row": 0, "num_rows": n, "rows_per_tile": 8, "num_splits": 1}]


@pytest.mark.parametrize("seed", range(24))
def test_random_batches(seed: int) -> None:
    """Random mixes of all of the above: GQA (partial tiles too), head and block sizes, dtypes, window, soft cap,
    scale, decode splits (sm_count 1 to 132) and cached prefixes."""
    rng = random.Random(seed)
    num_kv_heads, group = rng.choice([1, 2, 3]), rng.choice([1, 2, 3, 4, 5, 6, 8, 16])
    decodes = rng.randint(0, 3)
    query_lens = [1] * decodes + [rng.randint(2, 24) for _ in range(rng.randint(0 if decodes else 1, 2))]
    seq_lens = [rng.choice([rng.randint(1, 64), rng.randint(200, 1200)]) for _ in range(decodes)]
    seq_lens += [q + rng.choice([0, rng.randint(1, 150)]) for q in query_lens[decodes:]]
    spec = AttentionSpec(
        num_kv_heads * group,
        num_kv_heads,
        rng.choice([64, 80, 96, 112, 128, 160, 192, 256]),
        scale=rng.choice([None, None, 0.02, 0.2]),
        sliding_window=rng.choice([None, rng.randint(1, 300)]),
        logits_soft_cap=rng.choice([None, rng.uniform(1.0, 30.0)]),
    )
    dtype = rng.choice([F32, BF16, F16])
    query_dtype = rng.choice([dtype, dtype, F32, BF16])
    check_attention(query_lens, seq_lens, spec, rng.choice([16, 32, 64]), dtype, query_dtype, rng.choice([1, 16, 132]))


@pytest.mark.parametrize(
    ("src_dtype", "value_dtype", "cache_dtype"),
    [(F32, F32, F32), (F32, F32, BF16), (F16, F16, F32), (BF16, BF16, F16), (F16, F32, BF16)],
)
def test_write_kv(src_dtype: torch.dtype, value_dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """Keys and values land at their slots converted to the cache dtype (rounded to nearest even, bit for bit as
    torch rounds); slot -1 writes nothing; a value of another dtype than the key is converted first."""
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 6, 16, 2, 64, generator=gen).to(cache_dtype)
    slots = torch.tensor([17, -1, 0, 95, 40, -1, 33], dtype=torch.int64)
    kv = torch.randn(7, 2, 2, 64, generator=gen) * 300
    kv[0, 0, 0, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11])  # ties in bf16 / fp16
    key = kv.to(src_dtype)[:, 0]  # strided rows, unlike the value's
    value = torch.randn(7, 2, 64, generator=gen).to(value_dtype)
    assert key.stride(0) != value.stride(0)
    mine, theirs = cache.clone(), cache.clone()
    emulated.write_kv(key, value, mine, slots)
    metadata = build_attention_metadata([1], [1], [[0]], 16)
    REF.write_kv(key, value.to(src_dtype), theirs, dataclasses.replace(metadata, slot_mapping=slots))
    assert torch.equal(mine, theirs)
    assert not torch.equal(mine, cache)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_copy_blocks(dtype: torch.dtype) -> None:
    """Whole blocks, keys and values, copied between independent pairs; out-of-range pairs are skipped."""
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(2, 8, 16, 2, 64, generator=gen).to(dtype)
    pairs = torch.tensor([[1, 5], [2, 0], [7, 3]], dtype=torch.int64)
    mine, theirs = cache.clone(), cache.clone()
    emulated.copy_blocks(mine, pairs)
    REF.copy_blocks([theirs], pairs)
    assert torch.equal(mine, theirs) and not torch.equal(mine, cache)
    emulated.copy_blocks(mine, torch.tensor([[-1, 4], [4, 8], [9, 2]], dtype=torch.int64))
    assert torch.equal(mine, theirs)


EMULATOR_PROBE = r"""
#include <cstdio>
#include "emulation/cuda_on_cpu.h"

__global__ void sums(int* out) {  // warp sums by xor shuffles, then a block barrier around shared memory
  __shared__ int seen[64];
  int v = threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  seen[threadIdx.x] = v + blockIdx.x;
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = seen[63 - threadIdx.x];
}
__global__ void divergent_sync() { if (threadIdx.x < 32) __syncthreads(); }
__global__ void deadlock() { if (threadIdx.x % 32 == 0) __syncthreads(); else __shfl_xor_sync(0xffffffffu, 1, 1); }
__global__ void exited_lane() { if (threadIdx.x != 5) __shfl_xor_sync(0xffffffffu, 1, 1); }

int main() {
  int out[128];
  cuda_emu::launch(2, 64, nullptr, sums)(out);
  bool ok = cuda_emu::take_error() == nullptr;
  for (int i = 0; i < 128; ++i) ok = ok && out[i] == (i % 64 < 32 ? 1520 : 496) + i / 64;
  std::printf("%s\n", ok ? "sums ok" : "sums wrong");
  for (void (*kernel)() : {divergent_sync, deadlock, exited_lane}) {
    cuda_emu::launch(1, 64, nullptr, kernel)();
    const char* error = cuda_emu::take_error();
    std::printf("%s\n", error ? error : "no error");
  }
}
"""


def test_emulator_barriers(tmp_path: Path) -> None:
    """The emulator itself: shuffles and __syncthreads as the GPU defines them, and barrier misuse reported
    (a thread leaving while others wait at __syncthreads, a deadlock, a shuffle missing a lane), not hung."""
    source = tmp_path / "probe.cpp"
    source.write_text(EMULATOR_PROBE)
    flags = [f for f in emulated.FLAGS if f not in ("-shared", "-fPIC")]
    exe = tmp_path / "probe"
    subprocess.run([emulated.compiler(), *flags, f"-I{build.csrc()}", str(source), "-o", str(exe)], check=True)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert lines == [
        "sums ok",
        "a thread exited while others wait at __syncthreads",
        "deadlock: every live thread waits, at barriers that cannot complete (divergent __syncthreads/shuffle)",
        "a thread exited while its warp waits at a shuffle",
    ]
