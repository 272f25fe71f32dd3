"""Batch invariance (DESIGN.md, "a contract property"): a row's output bits alone against the same row in batches.

Nothing here compares with an oracle: a backend that declares invariance is compared with itself, bit for
bit. Rows (tokens) are first computed alone, in a call (or step) of their own; every later call that holds
one, among 1 to 511 other rows, in any order, in any chunk, must give it the same bits.

* Linear (each kind in ``fused_ops().batch_invariant_linear``): one weight per kind, packed as the engine
  packs it (the backend's ``pack_linear`` for a dense weight or a format of its ``linear_formats``, the
  reference's otherwise), and a pool of :data:`~paged_conformance.grid.INVARIANCE_POOL` rows of ``x``, 64 of
  them computed alone and all of them in one prefill call. Then calls of
  :data:`~paged_conformance.grid.INVARIANCE_ROWS` rows in random order (those computed alone first, others
  up to the size), the same 64 rows in two orders, and the pool in chunks: each row against its bits alone,
  or, for a row never computed alone, in the prefill call (:class:`RowCheck`).
* Layer ops (``fused_ops().batch_invariant_layer_ops``): ``rms_norm``, ``add_rms_norm`` (both outputs),
  ``silu_and_mul``, ``rotary`` (q and k as slices of one QKV buffer, as the fused decoder passes them) and
  ``rotate_heads`` (a key slice of one QKV buffer), in the same calls.
* Attention (``capabilities().batch_invariant``): one KV cache holding sequences of 1 to 1,283 keys (block
  edges, past 512 and 1,024: where kernels split key ranges). Query positions are decoded alone (a one-row
  step: query length 1, the sequence's keys up to that position); random steps of 1 to 17 rows mix decode
  rows at random positions with prefill chunks continuing random contexts; and the last 64 positions of the
  sequences of :data:`~paged_conformance.grid.INVARIANCE_CHUNK_SEQS` keys run as one prefill chunk, as
  chunks of random sizes among other rows, as speculative verify rows of 4 tokens, and as 64 decode rows of
  one step in shuffled order. Every token of every step must have the bits of its position decoded alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from paged_conformance.fused import (
    REFERENCE,
    generator,
    linear_weight,
    norm_rows,
    norm_weight,
    qkv_views,
    randn,
    rope_cache,
)
from paged_conformance.fused import positions as rotary_positions
from paged_conformance.grid import (
    INVARIANCE_ALONE,
    INVARIANCE_BATCHES,
    INVARIANCE_CHUNK,
    INVARIANCE_CHUNK_SEQS,
    INVARIANCE_CHUNKS,
    INVARIANCE_POOL,
    INVARIANCE_ROTATION_HEADS,
    INVARIANCE_ROWS,
    NUM_KV_HEADS,
    InvarianceLinearCase,
    dtype_name,
    invariance_seq_lens,
)
from paged_core.api import (
    LINEAR_FORMATS,
    LINEAR_KINDS,
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    FusedOps,
    PackedLinear,
    QuantizedWeight,
    build_attention_metadata,
)
from paged_core.testing import random_packed

RANDOM_CHUNK = 16
"""The longest prefill chunk of the random steps (each of its tokens is also decoded alone)."""
Rows = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
"""A call under test: rows of the pool (as indices into it) in, one or more ``[rows, ...]`` outputs out."""


def declared_linear(ops: FusedOps) -> frozenset[str]:
    """``ops``' ``batch_invariant_linear`` as names (none when it is no collection: the declaration check fails
    that)."""
    kinds = getattr(ops, "batch_invariant_linear", None)
    return frozenset(str(k) for k in kinds) if isinstance(kinds, (set, frozenset, list, tuple)) else frozenset()


def declared_layer_ops(ops: FusedOps) -> bool:
    """Whether ``ops`` declares ``batch_invariant_layer_ops`` (exactly ``True``)."""
    return getattr(ops, "batch_invariant_layer_ops", False) is True


def check_declaration(ops: FusedOps) -> None:
    """``batch_invariant_linear`` is a frozenset of known weight kinds and ``batch_invariant_layer_ops`` a bool."""
    kinds = getattr(ops, "batch_invariant_linear", None)
    if not isinstance(kinds, frozenset) or not all(isinstance(k, str) for k in kinds):
        raise AssertionError(
            f"{type(ops).__name__}.batch_invariant_linear must be a frozenset of weight kinds, got {kinds!r}"
        )
    unknown = sorted(kinds - set(LINEAR_KINDS))
    if unknown:
        raise AssertionError(
            f"{type(ops).__name__}.batch_invariant_linear names unknown weight kinds {unknown} "
            f"(known: {', '.join(LINEAR_KINDS)})"
        )
    flag = getattr(ops, "batch_invariant_layer_ops", None)
    if not isinstance(flag, bool):
        raise AssertionError(f"{type(ops).__name__}.batch_invariant_layer_ops must be True or False, got {flag!r}")


# --- comparing bits ----------------------------------------------------------------------------------------------


def _ints(t: torch.Tensor) -> torch.Tensor:
    kinds = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().cpu().contiguous().view(kinds[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and bits (``-0.0`` is not ``0.0``, a NaN equals the same NaN)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_ints(a), _ints(b))


def difference(got: torch.Tensor, want: torch.Tensor) -> str:
    """How ``got`` parts from ``want``: elements whose bits differ and the largest difference."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{tuple(got.shape)} {dtype_name(got.dtype)} instead of {tuple(want.shape)} {dtype_name(want.dtype)}"
    g, w = got.detach().float().cpu(), want.detach().float().cpu()
    bad = int((_ints(got) != _ints(want)).sum())
    err = float((g - w).abs().nan_to_num(float("inf")).max()) if g.numel() else 0.0
    return f"{bad} of {g.numel()} elements differ (max abs difference {err:.3g})"


# --- rows of fused ops and linears -------------------------------------------------------------------------------


@dataclass
class RowCheck:
    """One op over a pool of rows (``call`` maps pool indices to outputs), checked as the module says.

    :data:`~paged_conformance.grid.INVARIANCE_ALONE` rows of the pool are computed alone, each in a call of its
    own; the whole pool (:data:`~paged_conformance.grid.INVARIANCE_POOL` rows) once in order, as one prefill
    call. Then every call of :data:`~paged_conformance.grid.INVARIANCE_ROWS` rows, in random order (the rows
    computed alone first, others after them up to the call's size), the same 64 rows in two orders and the pool
    in chunks: each row must have its bits alone, or, for a row never computed alone, its bits in the prefill
    call (whose rows computed alone are checked first).
    """

    what: str
    call: Rows
    seed: int
    alone: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    prefill: tuple[torch.Tensor, ...] = ()

    def run(self) -> None:
        gen = generator(self.seed)
        order = torch.randperm(INVARIANCE_POOL, generator=gen)
        sample = order[:INVARIANCE_ALONE]
        self.alone = {i: self.call(torch.tensor([i])) for i in sample.tolist()}
        self.prefill = self.call(torch.arange(INVARIANCE_POOL))
        everything = torch.arange(INVARIANCE_POOL)
        self.compare(everything, f"the prefill call of all {INVARIANCE_POOL} rows", outs=self.prefill)
        for m in INVARIANCE_ROWS:
            rows = order[:m][torch.randperm(min(m, INVARIANCE_POOL), generator=gen)]
            self.compare(rows, f"a call of {m} rows")
        some = order[:64][torch.randperm(64, generator=gen)]
        self.compare(some, "64 rows")
        self.compare(some.flip(0), "the same 64 rows in reverse order")
        start = 0
        for size in INVARIANCE_CHUNKS:
            rows = torch.arange(start, min(start + size, INVARIANCE_POOL))
            self.compare(
                rows,
                f"rows {start}..{start + len(rows) - 1} of the pool in calls of "
                f"{', '.join(map(str, INVARIANCE_CHUNKS))} rows",
            )
            start += size

    def compare(self, rows: torch.Tensor, how: str, outs: tuple[torch.Tensor, ...] | None = None) -> None:
        outs = self.call(rows) if outs is None else outs
        for j, i in enumerate(rows.tolist()):
            alone = i in self.alone
            want = self.alone[i] if alone else tuple(t[i : i + 1] for t in self.prefill)
            for k, (out, ref) in enumerate(zip(outs, want, strict=True)):
                if not same_bits(out[j : j + 1], ref):
                    which = f" (output {k})" if len(outs) > 1 else ""
                    ref_name = "the same row alone" if alone else "the same row in the prefill call"
                    raise AssertionError(
                        f"{self.what}{which}: row {i} of the pool, at row {j} of {how}, differs from "
                        f"{ref_name}: {difference(out[j : j + 1], ref)}"
                    )


def invariance_weight(case: InvarianceLinearCase, gen: torch.Generator) -> torch.Tensor | QuantizedWeight:
    """The weight of ``case``: random packed bytes of its format, or a dense ``[N, K]`` weight of its dtype."""
    n, k = case.shape
    if case.kind in LINEAR_FORMATS:
        return random_packed(LINEAR_FORMATS[case.kind], n, k, gen)
    return linear_weight(gen, n, k).to(getattr(torch, case.kind))


def check_linear(ops: FusedOps, case: InvarianceLinearCase, device: torch.device) -> None:
    """One weight of ``case``'s kind, packed as the engine packs it, against each row of ``x`` alone."""
    gen = generator(case.seed)
    weight = invariance_weight(case, gen).to(device)
    n, k = case.shape
    bias = (0.5 * randn(gen, n)).to(device=device, dtype=case.dtype)
    own = not isinstance(weight, QuantizedWeight) or case.kind in getattr(ops, "linear_formats", frozenset())
    packed = (ops.pack_linear if own else REFERENCE.pack_linear)(weight, bias)
    if not isinstance(packed, PackedLinear):
        raise AssertionError(f"pack_linear returned {type(packed).__name__}, not a PackedLinear")
    packer = "the backend's pack_linear" if own else "the reference's pack_linear (an undeclared format)"
    x = randn(gen, INVARIANCE_POOL, k).to(device=device, dtype=case.dtype)
    what = f"linear {case.kind} [{n}, {k}] + bias, x {dtype_name(case.dtype)}, packed by {packer}"
    RowCheck(what, lambda rows: (ops.linear(x[rows.to(device)], packed),), case.seed).run()


def _rows_of(fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], *tensors: torch.Tensor) -> Rows:
    """A :data:`Rows` call: ``fn`` on the given rows of each of ``tensors`` (its result as a tuple)."""

    def call(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = fn(*(t[rows.to(t.device)] for t in tensors))
        return out if isinstance(out, tuple) else (out,)

    return call


def layer_op_checks(
    ops: FusedOps,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    head_size: int,
    hidden: Sequence[int],
    intermediate: Sequence[int],
    heads: tuple[int, int],
    rotation_sizes: Sequence[int] = (),
) -> list[RowCheck]:
    """One :class:`RowCheck` per op and shape: the norms at each hidden size, the activation at each
    intermediate size, rotary at ``head_size`` with ``heads`` (query, key) heads, ``rotate_heads`` at each of
    ``rotation_sizes`` with :data:`~paged_conformance.grid.INVARIANCE_ROTATION_HEADS` heads."""
    gen, pool, name = generator(seed), INVARIANCE_POOL, dtype_name(dtype)
    checks = []
    for h in hidden:
        x = norm_rows(gen, pool, h).to(device=device, dtype=dtype)
        r = norm_rows(gen, pool, h).to(device=device, dtype=dtype)
        w = norm_weight(gen, h).to(device=device, dtype=dtype)
        norm = functools.partial(ops.rms_norm, weight=w, eps=1e-6)
        add_norm = functools.partial(ops.add_rms_norm, weight=w, eps=1e-6)
        checks.append(RowCheck(f"rms_norm [T, {h}] {name}", _rows_of(norm, x), seed))
        checks.append(RowCheck(f"add_rms_norm [T, {h}] {name}", _rows_of(add_norm, x, r), seed))
    for i in intermediate:
        x = (2 * randn(gen, pool, 2 * i)).to(device=device, dtype=dtype)
        checks.append(RowCheck(f"silu_and_mul [T, {2 * i}] {name}", _rows_of(ops.silu_and_mul, x), seed))
    hq, hk = heads
    q = randn(gen, pool, hq, head_size).to(device=device, dtype=dtype)
    k = randn(gen, pool, hk, head_size).to(device=device, dtype=dtype)
    pos = rotary_positions(gen, pool).to(device)
    cache = rope_cache(head_size, device)

    def rotary(p: torch.Tensor, qr: torch.Tensor, kr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        qv, kv = qkv_views(qr, kr, generator(seed))  # as the fused decoder passes them: slices of one QKV output
        return ops.rotary(p, qv, kv, cache)

    checks.append(
        RowCheck(
            f"rotary q [T, {hq}, {head_size}], k [T, {hk}, {head_size}] (slices of one QKV buffer) {name}",
            _rows_of(rotary, pos, q, k),
            seed,
        )
    )
    h = INVARIANCE_ROTATION_HEADS
    for d in rotation_sizes:
        x = (2 * randn(gen, pool, h, d)).to(device=device, dtype=dtype)

        def rotate(xr: torch.Tensor) -> torch.Tensor:
            _, key = qkv_views(xr, xr, generator(seed))  # a key slice of one QKV output, as the engine passes it
            return ops.rotate_heads(key)

        checks.append(
            RowCheck(f"rotate_heads [T, {h}, {d}] (a slice of one QKV buffer) {name}", _rows_of(rotate, x), seed)
        )
    return checks


# --- attention ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of a step: ``count`` query tokens of sequence ``seq`` at positions ``start .. start + count - 1``."""

    seq: int
    start: int
    count: int

    @property
    def seq_len(self) -> int:
        return self.start + self.count

    def describe(self) -> str:
        kind = "decode row" if self.count == 1 else f"prefill chunk of {self.count} tokens"
        return f"{kind} of sequence {self.seq} at positions {self.start}..{self.seq_len - 1}"


class AttentionPool:
    """Sequences of random keys and values in one KV cache, and a query per position; steps over them.

    The cache is written once; each step then calls ``prepare`` and ``forward`` as the engine does, with this
    step's keys and values (the same bits at the same slots again) and the positions' queries.
    """

    def __init__(
        self,
        backend: AttentionBackend,
        spec: AttentionSpec,
        dtype: torch.dtype,
        block_size: int,
        seed: int,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        gen = generator(seed)
        self.backend, self.spec, self.dtype, self.block_size = backend, spec, dtype, block_size
        self.device = backend.device
        self.lens = invariance_seq_lens(block_size, gen)
        needed = [math.ceil(n / block_size) for n in self.lens]
        self.width = max(needed)
        num_blocks = 1 + sum(needed)
        order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        self.tables: list[list[int]] = []
        for n in needed:
            self.tables.append(order[:n])
            order = order[n:]
        q_scale = 2.0 * spec.head_size**-0.5 / spec.softmax_scale  # peaked softmax, as the attention checks use
        self.keys = [randn(gen, n, spec.num_kv_heads, spec.head_size).to(dtype) for n in self.lens]
        self.values = [randn(gen, n, spec.num_kv_heads, spec.head_size).to(dtype) for n in self.lens]
        self.queries = [randn(gen, n, spec.num_heads, spec.head_size, scale=q_scale).to(dtype) for n in self.lens]
        self.cache = backend.allocate_kv_cache(num_blocks, block_size, spec, kv_dtype or dtype)
        everything = [Row(s, 0, n) for s, n in enumerate(self.lens)]
        md = self._metadata(everything)
        k, v = self._tensors(everything, self.keys), self._tensors(everything, self.values)
        backend.prepare(md)
        backend.write_kv(k.to(self.device), v.to(self.device), self.cache, md)
        self.alone: dict[tuple[int, int], torch.Tensor] = {}

    def _ordered(self, rows: Sequence[Row]) -> list[Row]:
        # The contract's order: decode rows first, each group in the order given.
        return [r for r in rows if r.count == 1] + [r for r in rows if r.count > 1]

    def _metadata(self, rows: Sequence[Row]) -> AttentionMetadata:
        return build_attention_metadata(
            [r.count for r in rows],
            [r.seq_len for r in rows],
            [self.tables[r.seq] for r in rows],
            self.block_size,
            self.device,
            self.width,
        )

    def _tensors(self, rows: Sequence[Row], per_seq: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([per_seq[r.seq][r.start : r.seq_len] for r in rows])

    def step(self, rows: Sequence[Row]) -> list[tuple[Row, torch.Tensor]]:
        """One step over ``rows`` (put in the contract's order): each row with its output ``[count, H, D]``."""
        rows = self._ordered(rows)
        md = self._metadata(rows)
        q, k, v = (self._tensors(rows, t).to(self.device) for t in (self.queries, self.keys, self.values))
        self.backend.prepare(md)
        out = self.backend.forward(q, k, v, self.cache, md, self.spec).cpu()
        result, start = [], 0
        for r in rows:
            result.append((r, out[start : start + r.count]))
            start += r.count
        return result

    def decoded_alone(self, seq: int, pos: int) -> torch.Tensor:
        """Position ``pos`` of ``seq`` decoded in a step of its own (computed once)."""
        key = (seq, pos)
        if key not in self.alone:
            self.alone[key] = self.step([Row(seq, pos, 1)])[0][1][0]
        return self.alone[key]

    def check(self, rows: Sequence[Row], how: str) -> None:
        """Run ``rows`` as one step; every token must have the bits of its position decoded alone."""
        outs = self.step(rows)
        for r, out in outs:
            for t in range(r.count):
                want = self.decoded_alone(r.seq, r.start + t)
                if not same_bits(out[t], want):
                    raise AssertionError(
                        f"attention: position {r.start + t} of sequence {r.seq} ({self.lens[r.seq]} keys cached) in "
                        f"the {r.describe()}, in {how} ({len(outs)} rows), differs from the same position decoded "
                        f"alone: {difference(out[t], want)}"
                    )

    def random_row(self, gen: torch.Generator, decode: bool) -> Row:
        seq = int(torch.randint(len(self.lens), (1,), generator=gen))
        n = self.lens[seq]
        if decode or n < 2:
            return Row(seq, int(torch.randint(n, (1,), generator=gen)), 1)
        count = int(torch.randint(2, min(RANDOM_CHUNK, n) + 1, (1,), generator=gen))
        return Row(seq, int(torch.randint(n - count + 1, (1,), generator=gen)), count)


def check_attention(
    backend: AttentionBackend,
    dtype: torch.dtype,
    block_size: int,
    head_size: int,
    gqa: int,
    seed: int,
    kv_dtype: torch.dtype | None = None,
    share: int = 1,
) -> None:
    """The attention half of the section (see the module) at one dtype, block size and layer shape, over a KV
    cache of ``kv_dtype`` (default: the compute dtype; a quantized one is written once, like the others).
    ``share`` > 1 runs a lighter pass (a variant of a layout the full pass covered): 1/share of the random steps
    and the chunk comparison on the longest sequence only."""
    spec = AttentionSpec(NUM_KV_HEADS * gqa, NUM_KV_HEADS, head_size)
    pool = AttentionPool(backend, spec, dtype, block_size, seed, kv_dtype)
    gen = generator(seed + 1)
    # Decode rows alone then among others: 1..16 others, random order, prefill chunks in some steps.
    for b in range(INVARIANCE_BATCHES // share):
        count = 1 + int(torch.randint(17, (1,), generator=gen))
        rows = [
            pool.random_row(gen, decode=bool(b % 3 == 0) or bool(torch.rand(1, generator=gen) < 0.6))
            for _ in range(count)
        ]
        pool.check(rows, f"random step {b}")
    for n in INVARIANCE_CHUNK_SEQS if share == 1 else INVARIANCE_CHUNK_SEQS[-1:]:
        seq = pool.lens.index(n)
        first = n - INVARIANCE_CHUNK
        others = [pool.random_row(gen, decode=True), pool.random_row(gen, decode=False)]
        pool.check([Row(seq, first, INVARIANCE_CHUNK)], "a step of one prefill chunk")
        start = first
        while start < n:
            size = min(n - start, 1 + int(torch.randint(13, (1,), generator=gen)))
            pool.check([*others, Row(seq, start, size)], f"chunks of random sizes from {first}")
            start += size
        verify = [Row(seq, p, 4) for p in range(first, n, 4)]
        pool.check(verify, "a step of speculative verify rows of 4 tokens each")
        decodes = [Row(seq, p, 1) for p in torch.randperm(INVARIANCE_CHUNK, generator=gen).add(first).tolist()]
        pool.check(decodes, "one step of decode rows in shuffled order")
