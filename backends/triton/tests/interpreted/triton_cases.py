"""What the interpreted kernel checks share: paged batches run through the kernels and through the core reference.

Not a test module (its name does not match ``interp_*.py``); the checks import it from this folder.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    build_attention_metadata,
    dequantize_kv,
    is_quantized_kv,
    quantize_kv,
)
from paged_core.testing import ReferenceBackend
from paged_triton import launch

QUANTIZED = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
"""Absolute and relative tolerance per compute dtype (``|got - want| <= tol * (1 + |want|)``)."""


def seed_of(*parts: object) -> int:
    """A seed fixed by the test's parameters (``hash`` of strings changes between processes)."""
    return zlib.crc32(repr(parts).encode())


def write(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata) -> None:
    launch.write_kv(key, value, cache, md.slot_mapping)


def attend(
    q: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, spec: AttentionSpec, block_table: torch.Tensor | None
) -> torch.Tensor:
    """The attention launch as ``TritonBackend.attention`` makes it (optionally with another block table)."""
    return launch.attention(
        q,
        cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table if block_table is None else block_table,
        md.num_decodes,
        md.num_prefills,
        md.max_query_len,
        md.max_seq_len,
        float(spec.softmax_scale),
        float(spec.logits_soft_cap or 0.0),
        int(spec.sliding_window or 0),
    )


def tables(seq_lens: list[int], block: int, num_blocks: int, gen: torch.Generator) -> list[list[int]]:
    """Each row's blocks, distinct and shuffled, never block 0 (the null block)."""
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    out, i = [], 0
    for s in seq_lens:
        n = -(-s // block)
        out.append(perm[i : i + n])
        i += n
    return out


def poison(cache: torch.Tensor, blocks: list[int]) -> None:
    """Make ``blocks`` unreadable: NaN in a float cache; in a quantized one, NaN scales (and NaN fp8 values)."""
    if is_quantized_kv(cache.dtype):
        cache.view(torch.uint8)[:, blocks] = 0x7F  # fp8 NaN; as a float16 scale 0x7f7f is NaN too
    else:
        cache[:, blocks] = float("nan")


def poison_before_windows(
    cache: torch.Tensor, rows: list[list[int]], query_lens: list[int], seq_lens: list[int], window: int, block: int
) -> torch.Tensor:
    """NaN into the null block and every block wholly before the window of a row's first query; a block table
    whose entries for those blocks are, in turn, the null block, the row's own (now NaN) block and a block of
    another row (a stale id). Returns that table (the reference keeps the true one)."""
    width = max(len(r) for r in rows)
    table = torch.zeros(len(rows), width, dtype=torch.int32)
    dead = [0]
    for b, (row, q_len, seq_len) in enumerate(zip(rows, query_lens, seq_lens, strict=True)):
        table[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
        first_key = max(0, seq_len - q_len - window + 1)
        for j in range(first_key // block):
            dead.append(row[j])
            other = rows[(b + 1) % len(rows)]
            table[b, j] = (0, row[j], other[-1])[j % 3]
    poison(cache, dead)
    return table


@dataclass
class Outcome:
    """The kernels' output, the reference's, and the tolerance of the compute dtype."""

    got: torch.Tensor
    want: torch.Tensor
    tol: float

    def error(self) -> float:
        """Largest ``|got - want| / (1 + |want|)``."""
        diff = (self.got.float() - self.want.float()).abs() / (1.0 + self.want.float().abs())
        return float(diff.max())

    def check(self) -> None:
        assert self.got.dtype == self.want.dtype, (self.got.dtype, self.want.dtype)
        assert not self.got.isnan().any(), "NaN in the output: the kernel read a poisoned block"
        assert self.error() <= self.tol, f"max error {self.error()} > {self.tol}"


def run_case(
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head: int,
    block: int,
    query_lens: list[int],
    seq_lens: list[int],
    *,
    scale: float | None = None,
    window: int | None = None,
    soft_cap: float | None = None,
    poisoned: bool = False,
    kernel_write: bool = True,
    q_gain: float = 1.0,
) -> Outcome:
    """Store a batch's keys and values, then attend with the kernels and with the reference.

    ``kernel_write``: store with the write kernel and check it stored exactly what the reference arithmetic
    does (the reference's write, or :func:`quantize_kv` for a quantized cache); otherwise store with torch
    (long contexts: the interpreter runs one program per token). The reference attends over the same values
    (a quantized cache dequantized to the compute dtype). ``poisoned``: NaN before every window, see
    :func:`poison_before_windows`. ``q_gain`` scales the queries (large scores, where a soft cap matters).
    """
    gen = torch.Generator().manual_seed(seed_of(dtype, kv_dtype, heads, kv_heads, head, block, seq_lens, window))
    spec = AttentionSpec(heads, kv_heads, head, scale=scale, sliding_window=window, logits_soft_cap=soft_cap)
    num_blocks = sum(-(-s // block) for s in seq_lens) + 3
    rows = tables(seq_lens, block, num_blocks, gen)
    whole = build_attention_metadata(seq_lens, seq_lens, rows, block)
    step = build_attention_metadata(query_lens, seq_lens, rows, block)
    quantized = is_quantized_kv(kv_dtype)
    stored_dtype = dtype if quantized else kv_dtype
    k = torch.randn(sum(seq_lens), kv_heads, head, generator=gen).to(stored_dtype).to(dtype)
    v = torch.randn(sum(seq_lens), kv_heads, head, generator=gen).to(stored_dtype).to(dtype)
    ref = ReferenceBackend("cpu")
    cache = ref.allocate_kv_cache(num_blocks, block, spec, kv_dtype)
    if quantized:
        expected = cache.clone()
        flat = expected.view(2, -1, kv_heads, head + 2)
        flat[0, whole.slot_mapping] = quantize_kv(k, kv_dtype)
        flat[1, whole.slot_mapping] = quantize_kv(v, kv_dtype)
        plain = dequantize_kv(expected, dtype)
    else:
        plain = ref.allocate_kv_cache(num_blocks, block, spec, dtype)
        ref.write_kv(k, v, plain, whole)
        expected = plain.to(kv_dtype)
    if kernel_write:
        write(k, v, cache, whole)
        same = torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
        assert same, f"write_kv stored other bytes than the reference arithmetic ({kv_dtype})"
    else:
        cache.copy_(expected)
    table = None
    if poisoned:
        assert window is not None
        table = poison_before_windows(cache, rows, query_lens, seq_lens, window, block)
    # Queries as a strided view (every other head of a wider tensor), as from a fused projection.
    q = (q_gain * torch.randn(sum(query_lens), 2 * heads, head, generator=gen)).to(dtype)[:, ::2]
    want = ref.attention(q, plain, step, spec)
    got = attend(q, cache, step, spec, table)
    return Outcome(got, want, TOL[dtype])
