"""The test grid: which configurations the suite runs, given what a backend declares.

The full cartesian product of every axis is far too large for a CPU run, so a
grid is a union of sweeps: every batch kind and length edge case at each
declared dtype and block size, plus smaller sweeps: head size x GQA ratio x
KV-head count, a wide batch (many rows), a long context, an explicit softmax
scale, each declared KV-cache dtype (quantized ones, int8 and fp8 with per
token-head scales, over a long context too), and strided input views. The fused
layer ops (:class:`paged_core.api.FusedOps`) get their own small sweeps per
declared dtype, and the packed-weight linears (:mod:`paged_core.quant`) one
item per format and dtype, a union of an M sweep, model shapes and odd ones.
Only declared values are generated; an undeclared one is N/A, never a
failure.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from paged_core.api import DENSE_LINEAR_KINDS, LINEAR_KINDS, QUANTIZED_KV_DTYPES, BackendCapabilities, is_quantized_kv
from paged_core.api import LINEAR_FORMATS as FORMATS_BY_NAME

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""Every dtype the suite knows how to test."""
HEAD_SIZES: tuple[int, ...] = (64, 80, 128, 256)
GQA_RATIOS: tuple[int, ...] = (1, 4, 8)
EDGE_KINDS: tuple[str, ...] = ("decode", "prefill", "mixed", "prefix")
"""Batch kinds swept over every length edge: pure decode, pure prefill, decodes then prefills, prefill over cache."""
KINDS: tuple[str, ...] = (*EDGE_KINDS, "wide", "long_context")
"""Every batch kind; ``wide`` is 14 decodes and 2 prefills, ``long_context`` has a row of ~1.3k tokens."""
LENGTHS: tuple[str, ...] = ("1", "block-1", "block", "block+1", "long")
GRIDS: tuple[str, ...] = ("quick", "full")
NUM_KV_HEADS = 2
"""Two KV heads, so a wrong query-to-KV head mapping cannot hide behind a single head."""
KV_HEAD_SWEEP: tuple[int, ...] = (1, 8)
"""Other KV-head counts, swept with every GQA ratio."""
LONG_CONTEXT = 1283
"""Tokens of the longest row (not block aligned; far past any 256-key split of a kernel)."""
SCALE = 0.3
"""An explicit ``AttentionSpec.scale``, far from ``head_size ** -0.5`` for every head size the suite uses."""
LAYOUTS: tuple[str, ...] = ("contiguous", "fused", "head_major")
"""How q/k/v reach the backend: contiguous, slices of one fused QKV tensor, or token-major views of head-major data."""
QUANTIZED_KV: tuple[torch.dtype, ...] = tuple(QUANTIZED_KV_DTYPES)
"""Quantized KV-cache dtypes (int8, float8_e4m3fn, float8_e5m2): per token-head scales, the rule of
:mod:`paged_core.contract.kv_quant`."""
KV_DTYPES: tuple[torch.dtype, ...] = DTYPES + QUANTIZED_KV
"""Every KV-cache dtype the suite knows how to test."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def length_value(label: str, block_size: int) -> int:
    """The token count a length label means at ``block_size`` ("long" is 3 blocks + 3, at least 35)."""
    table = {
        "1": 1,
        "block-1": block_size - 1,
        "block": block_size,
        "block+1": block_size + 1,
        "long": max(3 * block_size + 3, 35),
        "1k": max(LONG_CONTEXT, 4 * block_size + 3),
    }
    if label not in table:
        raise ValueError(f"unknown length label {label!r} (known: {', '.join(LENGTHS)})")
    return table[label]


@dataclass(frozen=True)
class Case:
    """One attention configuration and batch shape to compare against the oracle."""

    dtype: torch.dtype
    head_size: int
    block_size: int
    gqa: int
    kind: str
    length: str
    num_kv_heads: int = NUM_KV_HEADS
    scale: float | None = None
    """``AttentionSpec.scale``; None means the default ``head_size ** -0.5``."""
    kv_dtype: torch.dtype | None = None
    """The KV cache's dtype; None means the compute dtype."""
    layout: str = "contiguous"
    """One of :data:`LAYOUTS`."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r} (known: {', '.join(LAYOUTS)})")

    @property
    def id(self) -> str:
        """Readable pytest id: ``dtype-head-block-gqa-kind-len``, then any non-default extras.

        Extras: ``-kvhN`` (KV heads), ``-scaleS``, ``-kvcache_DTYPE``, ``-LAYOUT``.
        """
        base = f"{dtype_name(self.dtype)}-h{self.head_size}-b{self.block_size}-gqa{self.gqa}-{self.kind}-{self.length}"
        extras = []
        if self.num_kv_heads != NUM_KV_HEADS:
            extras.append(f"kvh{self.num_kv_heads}")
        if self.scale is not None:
            extras.append(f"scale{self.scale:g}")
        if self.kv_dtype is not None and self.kv_dtype != self.dtype:
            extras.append(f"kvcache_{dtype_name(self.kv_dtype)}")
        if self.layout != "contiguous":
            extras.append(self.layout)
        return "-".join([base, *extras])

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.gqa

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's dtype (the compute dtype unless ``kv_dtype`` says otherwise)."""
        return self.kv_dtype if self.kv_dtype is not None else self.dtype

    @property
    def tokens(self) -> int:
        """The length label resolved at this case's block size."""
        return length_value(self.length, self.block_size)

    @property
    def seed(self) -> int:
        """A stable per-case seed, so a failure reproduces exactly."""
        return zlib.crc32(self.id.encode())

    def capabilities(self) -> list[str]:
        """The capability rows of the report this case counts towards."""
        return [
            f"dtype:{dtype_name(self.dtype)}",
            f"head_size:{self.head_size}",
            f"block_size:{self.block_size}",
            f"gqa:{self.gqa}",
            f"batch:{self.kind}",
            f"kv_dtype:{dtype_name(self.cache_dtype)}",
            f"num_kv_heads:{self.num_kv_heads}",
            *(["scale"] if self.scale is not None else []),
            *(["strided_inputs"] if self.layout != "contiguous" else []),
        ]


def declared_dtypes(caps: BackendCapabilities) -> list[torch.dtype]:
    """Known dtypes the backend declares, in the suite's order."""
    return [d for d in DTYPES if d in caps.dtypes]


def declared_head_sizes(caps: BackendCapabilities) -> list[int]:
    return [h for h in HEAD_SIZES if caps.head_sizes is None or h in caps.head_sizes]


def declared_gqa(caps: BackendCapabilities) -> list[int]:
    return [g for g in GQA_RATIOS if caps.gqa_ratios is None or g in caps.gqa_ratios]


def declared_kv_dtypes(caps: BackendCapabilities) -> list[torch.dtype]:
    """Known KV-cache dtypes the backend declares (its compute dtypes when it declares none)."""
    return [d for d in KV_DTYPES if d in caps.effective_kv_cache_dtypes]


def _valid(kind: str, tokens: int) -> bool:
    # A one-token query is a decode row, so prefill kinds need at least two.
    return tokens >= 1 and (kind in ("decode", "mixed") or tokens >= 2)


def base_config(caps: BackendCapabilities) -> tuple[int, int] | None:
    """The (head size, GQA ratio) the main sweep uses; None if nothing the suite knows is declared."""
    heads, gqas = declared_head_sizes(caps), declared_gqa(caps)
    if not heads or not gqas:
        return None
    head = 128 if 128 in heads else heads[0]
    gqa = 4 if 4 in gqas else gqas[0]
    return head, gqa


def attention_cases(caps: BackendCapabilities, grid: str) -> list[Case]:
    """The attention comparisons for ``grid`` ("quick" or "full"), deduplicated, in a stable order."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r} (known: {', '.join(GRIDS)})")
    base = base_config(caps)
    dtypes = declared_dtypes(caps)
    if base is None or not dtypes:
        return []
    head, gqa = base
    full = grid == "full"
    preferred = caps.block_sizes[0]
    blocks = list(caps.block_sizes)
    if not full:
        # Edges at the preferred block size, a reduced set at the smallest and largest ones.
        blocks = sorted({preferred, min(blocks), max(blocks)}, key=blocks.index)
        dtypes = dtypes[:2]
    first = dtypes[0]
    seen: dict[str, Case] = {}

    def add(case: Case) -> None:
        if _valid(case.kind, case.tokens) and case.id not in seen:
            seen[case.id] = case

    for dtype in dtypes:
        for block in blocks:
            lens = LENGTHS if full or block == preferred else ("1", "block+1", "long")
            for kind in EDGE_KINDS:
                for length in lens:
                    add(Case(dtype, head, block, gqa, kind, length))
    # Many rows: every block size at the first dtype, every dtype at the preferred block size.
    for block in blocks:
        add(Case(first, head, block, gqa, "wide", "long"))
    for dtype in dtypes:
        add(Case(dtype, head, preferred, gqa, "wide", "long"))
    for dtype in dtypes if full else [first]:
        add(Case(dtype, head, preferred, gqa, "long_context", "1k"))
    for dtype in dtypes if full else [first]:
        for h in declared_head_sizes(caps):
            for g in declared_gqa(caps):
                add(Case(dtype, h, preferred, g, "mixed", "block+1"))
    for g in declared_gqa(caps):
        for kv_heads in KV_HEAD_SWEEP:
            add(Case(first, head, preferred, g, "mixed", "block+1", num_kv_heads=kv_heads))
    kinds = ("mixed", "prefix") if full else ("mixed",)
    for kind in kinds:
        add(Case(first, head, preferred, gqa, kind, "block+1", scale=SCALE))
        for layout in LAYOUTS[1:]:
            add(Case(first, head, preferred, gqa, kind, "block+1", layout=layout))
    for dtype in dtypes if full else [first]:
        for kv in declared_kv_dtypes(caps):
            for kind in kinds:
                if kv != dtype:
                    add(Case(dtype, head, preferred, gqa, kind, "block+1", kv_dtype=kv))
    if full:  # a quantized cache over a long context too: scales read block after block, past any key split
        for kv in declared_kv_dtypes(caps):
            if is_quantized_kv(kv):
                add(Case(first, head, preferred, gqa, "long_context", "1k", kv_dtype=kv))
    return list(seen.values())


def feature_cases(caps: BackendCapabilities, grid: str) -> list[Case]:
    """Batches for sliding window and soft cap: each batch kind at the preferred block size."""
    base = base_config(caps)
    dtypes = declared_dtypes(caps)
    if base is None or not dtypes:
        return []
    head, gqa = base
    kinds = EDGE_KINDS if grid == "full" else ("decode", "mixed")
    return [Case(dtypes[0], head, caps.block_sizes[0], gqa, kind, "long") for kind in kinds]


FUSED_OPS: tuple[str, ...] = ("rms_norm", "add_rms_norm", "silu_and_mul", "rotary", "rotate_heads", "linear")
"""The ops of :class:`paged_core.api.FusedOps` checked against the reference (``pack_linear`` with ``linear``)."""
FUSED_LAYOUTS: tuple[str, ...] = ("contiguous", "strided")
"""``strided``: every input a view into a larger buffer (column slices, q/k slices of one QKV output, transposes)."""
NORM_HIDDEN: tuple[int, ...] = (64, 67, 100, 576)
"""Hidden sizes of the norm checks: a vector multiple, an odd one, one no multiple of 8, SmolLM2-135M's."""
FUSED_TOKENS: tuple[int, ...] = (1, 7, 130)
"""Token counts ``T`` of the norm, activation and rotary checks."""
NORM_EPS: tuple[float, ...] = (1e-5, 1e-6)
SILU_INTERMEDIATE: tuple[int, ...] = (64, 77, 1536)
"""``I`` of ``silu_and_mul`` (its input is ``[T, 2I]``)."""
ROTARY_HEADS: tuple[tuple[int, int], ...] = ((4, 4), (8, 2), (8, 1))
"""``(query heads, key heads)`` of the rotary checks: equal, grouped, one key head."""
ROTATION_HEADS: tuple[int, ...] = (1, 9)
"""Heads ``H`` of the ``rotate_heads`` checks (``x`` ``[T, H, D]``): one, and SmolLM2-135M's query heads."""
ROTARY_MAX_POSITION = 32768
"""Rows of the cos/sin cache; positions reach its last row."""
ROTARY_BASE = 10000.0
LINEAR_TOKENS: tuple[int, ...] = (1, 3, 16, 64, 300)
"""``M`` (rows of ``x``) per packed weight: one pack, then a call at every ``M``."""
LINEAR_SHAPES: tuple[tuple[int, int], ...] = ((64, 64), (96, 136), (37, 100), (257, 77), (48, 1536))
"""``(out_features N, in_features K)``: multiples of 16, of 8 only, of neither, both odd, a long reduction."""


@dataclass(frozen=True)
class FusedCase:
    """One dtype and input layout at which every shape of one fused op is compared with the reference."""

    dtype: torch.dtype
    layout: str = "contiguous"

    def __post_init__(self) -> None:
        if self.layout not in FUSED_LAYOUTS:
            raise ValueError(f"unknown fused layout {self.layout!r} (known: {', '.join(FUSED_LAYOUTS)})")

    @property
    def id(self) -> str:
        """``dtype``, then ``-strided`` for views."""
        return dtype_name(self.dtype) + ("" if self.layout == "contiguous" else f"-{self.layout}")

    @property
    def seed(self) -> int:
        return zlib.crc32(f"fused-{self.id}".encode())


def fused_cases(caps: BackendCapabilities, grid: str) -> list[FusedCase]:
    """Every declared dtype (the first two under ``quick``, as for attention) in each input layout."""
    dtypes = declared_dtypes(caps)
    if grid != "full":
        dtypes = dtypes[:2]
    return [FusedCase(d, layout) for d in dtypes for layout in FUSED_LAYOUTS]


def fused_trace_cases(caps: BackendCapabilities, grid: str) -> list[FusedCase]:
    """The dtypes each op is traced at (strided inputs, as a compiled step passes them): the first one under quick."""
    dtypes = declared_dtypes(caps)
    return [FusedCase(d, "strided") for d in (dtypes if grid == "full" else dtypes[:1])]


LINEAR_FORMATS: tuple[str, ...] = tuple(FORMATS_BY_NAME)
"""Every packed weight format the core reads (``q4_0``, ``q4_1``, ``q8_0``, ``q4_k``, ``q6_k``, ``int8``)."""
LINEAR_FORMAT_TOKENS: tuple[int, ...] = (1, 2, 3, 7, 16, 17, 64, 512)
"""``M`` (rows of ``x``) of the M sweep: decode, tiny batches, sizes around 16, a prefill chunk."""
LINEAR_FORMAT_TOKENS_QUICK: tuple[int, ...] = (1, 3, 17, 512)
LINEAR_SWEEP_SHAPES: tuple[tuple[int, int], ...] = ((192, 576), (256, 2048))
"""``(N, K)`` the M sweep runs on: the first whose ``K`` is a multiple of the format's block. SmolLM2-135M's k/v
projection; for the 256-blocks of ``q4_k``/``q6_k`` (576 is none), TinyLlama-1.1B's."""
LINEAR_MODEL_SHAPES: tuple[tuple[int, int], ...] = ((3072, 576), (576, 1536), (576, 576), (1024, 4096))
"""Other ``(N, K)`` of real layers, each where its ``K`` is a multiple of the format's block: SmolLM2-135M's
merged gate+up, down and q/o projections, and a 7-8B model's k/v projection (Llama-3-8B, Mistral-7B: a
4096-long reduction, ``full`` only). ``quick`` keeps the first that fits, at decode."""
LINEAR_ODD_N: tuple[int, int] = (37, 100)
"""Output sizes no multiple of 16 (37: of nothing), with ``K`` one block and three blocks (77 for ``int8``)."""
LINEAR_LAYOUTS: tuple[str, ...] = ("contiguous", "columns", "rows")
"""How ``x`` reaches ``linear``: contiguous, a column slice of a wider buffer, every other row of a buffer."""
LINEAR_STRIDED_CALLS: tuple[tuple[int, str], ...] = ((17, "columns"), (2, "rows"), (64, "rows"), (3, "columns"))
"""``(M, layout)`` of the strided calls after the M sweep (``quick``: the first two)."""


@dataclass(frozen=True)
class LinearWeight:
    """One packed weight of the linear-format sweep and the calls made with it (after one ``pack_linear``)."""

    n: int
    k: int
    bias: bool
    calls: tuple[tuple[int, str], ...]
    """``(M, layout)`` of every ``linear`` call, in order."""

    @property
    def label(self) -> str:
        return f"[{self.n}, {self.k}]" + (" + bias" if self.bias else "")


def _sweep_shape(block: int) -> tuple[int, int]:
    """The M sweep's ``(N, K)`` for a format's block."""
    return next(s for s in LINEAR_SWEEP_SHAPES if s[1] % block == 0)


def _odd_weights(block: int) -> list[LinearWeight]:
    """``N`` = 37 with ``K`` one block (bias) and ``N`` = 100 with three blocks (``int8``: ``K`` = 77), no bias."""
    odd_k = 3 * block if block > 1 else 77
    return [
        LinearWeight(LINEAR_ODD_N[0], block, True, ((1, "contiguous"), (3, "contiguous"), (17, "columns"))),
        LinearWeight(LINEAR_ODD_N[1], odd_k, False, ((1, "contiguous"), (3, "rows"), (17, "contiguous"))),
    ]


def linear_weights(fmt: str, grid: str) -> list[LinearWeight]:
    """One format's weights and calls: the M sweep then strided inputs (bias), the other model shapes at decode and
    a prefill-tail ``M`` (bias alternating; ``quick``: the first, at decode), and the two odd shapes."""
    block = FORMATS_BY_NAME[fmt].block_size
    full = grid == "full"
    tokens = LINEAR_FORMAT_TOKENS if full else LINEAR_FORMAT_TOKENS_QUICK
    strided = LINEAR_STRIDED_CALLS if full else LINEAR_STRIDED_CALLS[:2]
    out = [LinearWeight(*_sweep_shape(block), True, tuple((m, "contiguous") for m in tokens) + strided)]
    others = [s for s in LINEAR_MODEL_SHAPES if s[1] % block == 0]
    for i, (n, k) in enumerate(others if full else others[:1]):
        ms = (1,) if not full or n * k >= 4_000_000 else (1, 17)
        out.append(LinearWeight(n, k, i % 2 == 0, tuple((m, "contiguous") for m in ms)))
    return out + _odd_weights(block)


def linear_fallback_weights(fmt: str) -> list[LinearWeight]:
    """What the fallback check multiplies per undeclared format: the M sweep's shape at two ``M`` (the second a
    column slice), and the two odd shapes."""
    block = FORMATS_BY_NAME[fmt].block_size
    return [LinearWeight(*_sweep_shape(block), True, ((1, "contiguous"), (17, "columns"))), *_odd_weights(block)]


@dataclass(frozen=True)
class LinearFormatCase:
    """One packed format at one compute dtype."""

    format: str
    dtype: torch.dtype

    @property
    def id(self) -> str:
        """``format-dtype``, e.g. ``q4_k-bfloat16``."""
        return f"{self.format}-{dtype_name(self.dtype)}"

    @property
    def seed(self) -> int:
        return zlib.crc32(f"linear-{self.id}".encode())

    def capabilities(self) -> list[str]:
        return [f"linear_format:{self.format}"]


def linear_format_cases(caps: BackendCapabilities, grid: str) -> list[LinearFormatCase]:
    """Every format at every declared dtype (the first two under ``quick``), format by format.

    Formats the backend's ``fused_ops().linear_formats`` leaves out are
    generated too: their checks report N/A (or, for the fallback check, run).
    """
    dtypes = declared_dtypes(caps)
    if grid != "full":
        dtypes = dtypes[:2]
    return [LinearFormatCase(f, d) for f in LINEAR_FORMATS for d in dtypes]


INVARIANCE_PARTS: tuple[str, ...] = ("attention", "layer_ops", *(f"linear:{k}" for k in LINEAR_KINDS))
"""Rows of the batch-invariance section: ``batch_invariance:attention`` (``capabilities().batch_invariant``),
``batch_invariance:layer_ops`` (``fused_ops().batch_invariant_layer_ops``) and one per weight kind
(``batch_invariance:linear:q4_0``... ``batch_invariance:linear:float32``: ``fused_ops().batch_invariant_linear``)."""
INVARIANCE_ROWS: tuple[int, ...] = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 333, 512)
"""Row counts each fused op and linear is called at (rows drawn from one pool, in random order): decode, small
batches around the sizes kernels tile by, and prefill-sized calls (333 rows of 100 values: torch's elementwise
ops split that between threads in the middle of a row)."""
INVARIANCE_POOL = 512
"""Rows in the pool the calls draw from; all of them are also computed as one prefill call, in order."""
INVARIANCE_ALONE = 64
"""Rows of the pool computed alone, each in a call of its own; every call holds as many of them as it can."""
INVARIANCE_CHUNKS: tuple[int, ...] = (100, 1, 37, 200, 5, 169)
"""The pool once more, in calls of these sizes, in order (a prefill run in chunks)."""
INVARIANCE_LINEAR_SHAPES: tuple[tuple[int, int], ...] = ((192, 576), (256, 2048))
"""``(N, K)`` of the invariance linear: the first whose ``K`` is a multiple of the kind's block (SmolLM2-135M's k/v
projection; TinyLlama-1.1B's for the 256-blocks of ``q4_k``/``q6_k``)."""
INVARIANCE_NORM_HIDDEN: tuple[int, ...] = (67, 576)
"""Hidden sizes of the norm invariance checks: an odd one, and SmolLM2-135M's."""
INVARIANCE_SILU_INTERMEDIATE: tuple[int, ...] = (100, 1536)
"""``I`` of the ``silu_and_mul`` invariance checks: no multiple of a vector (a thread's share of 333 rows starts
mid-row, off the vector grid: measured, torch's batched silu then gives a row other bits), and SmolLM2-135M's."""
INVARIANCE_ROTARY_HEADS: tuple[int, int] = (8, 2)
"""``(query heads, key heads)`` of the rotary invariance check (q and k slices of one QKV buffer)."""
INVARIANCE_ROTATION_HEADS = 9
"""Heads of the ``rotate_heads`` invariance check (``x`` the key slice of one QKV buffer)."""
INVARIANCE_SEQ_LENS: tuple[str | int, ...] = (
    1,
    2,
    "block-1",
    "block",
    "block+1",
    37,
    100,
    255,
    256,
    257,
    513,
    640,
    777,
    1024,
    1283,
)
"""Key counts of the attention pool's sequences (labels resolved at the block size), plus
:data:`INVARIANCE_RANDOM_SEQS` random ones up to :data:`LONG_CONTEXT`: short rows, block edges, and key ranges
past 512 and 1024, where kernels split keys (flash decoding)."""
INVARIANCE_RANDOM_SEQS = 6
INVARIANCE_BATCHES = 24
"""Random mixed steps of the attention check: 1 to 17 rows, decodes at random positions first, then prefill chunks
of 2 to 16 tokens continuing random contexts (prefix-cache hits), in random order."""
INVARIANCE_CHUNK = 64
"""Positions of the chunk comparison: the last 64 positions of a sequence, as one prefill chunk, as chunks of
random sizes, as speculative verify rows of 4, and as decode rows in one step in shuffled order."""
INVARIANCE_CHUNK_SEQS: tuple[int, ...] = (513, 1024, 1283)
"""Key counts of the sequences the chunk comparison runs on: just past 512 keys, a multiple of 512, the longest."""


@dataclass(frozen=True)
class InvarianceCase:
    """One compute dtype of the batch-invariance checks of attention and the layer ops."""

    dtype: torch.dtype

    @property
    def id(self) -> str:
        return dtype_name(self.dtype)

    @property
    def seed(self) -> int:
        return zlib.crc32(f"invariance-{self.id}".encode())


@dataclass(frozen=True)
class InvarianceLinearCase:
    """One weight kind (a packed format or a dense dtype) at one compute dtype of ``x``."""

    kind: str
    dtype: torch.dtype

    @property
    def id(self) -> str:
        """``q4_k-bfloat16`` for a packed format at a dtype; ``dense-float32`` for a dense weight."""
        return f"dense-{self.kind}" if self.kind in DENSE_LINEAR_KINDS else f"{self.kind}-{dtype_name(self.dtype)}"

    @property
    def seed(self) -> int:
        return zlib.crc32(f"invariance-linear-{self.id}".encode())

    @property
    def shape(self) -> tuple[int, int]:
        """The weight's ``(N, K)`` (:data:`INVARIANCE_LINEAR_SHAPES`)."""
        block = FORMATS_BY_NAME[self.kind].block_size if self.kind in FORMATS_BY_NAME else 1
        return next(s for s in INVARIANCE_LINEAR_SHAPES if s[1] % block == 0)

    def capabilities(self) -> list[str]:
        return [f"batch_invariance:linear:{self.kind}"]


def invariance_cases(caps: BackendCapabilities, grid: str) -> list[InvarianceCase]:
    """Every declared dtype (the first two under ``quick``)."""
    dtypes = declared_dtypes(caps)
    return [InvarianceCase(d) for d in (dtypes if grid == "full" else dtypes[:2])]


def invariance_linear_cases(caps: BackendCapabilities, grid: str) -> list[InvarianceLinearCase]:
    """Each packed format at every declared dtype (the first two under ``quick``), then each dense dtype at itself.

    Every kind is generated; those ``fused_ops().batch_invariant_linear`` leaves out report N/A."""
    dtypes = [c.dtype for c in invariance_cases(caps, grid)]
    packed = [InvarianceLinearCase(k, d) for k in FORMATS_BY_NAME for d in dtypes]
    return packed + [InvarianceLinearCase(k, getattr(torch, k)) for k in DENSE_LINEAR_KINDS]


def invariance_seq_lens(block_size: int, gen: torch.Generator) -> list[int]:
    """The attention pool's key counts: :data:`INVARIANCE_SEQ_LENS` at ``block_size``, then random ones."""
    fixed = [v if isinstance(v, int) else length_value(v, block_size) for v in INVARIANCE_SEQ_LENS]
    extra = torch.randint(1, LONG_CONTEXT + 1, (INVARIANCE_RANDOM_SEQS,), generator=gen).tolist()
    return [max(1, n) for n in fixed + extra]


def rotary_head_sizes(caps: BackendCapabilities) -> list[int]:
    """Declared head sizes (the suite's own when any is allowed) that rotary can rotate (even ones)."""
    sizes = sorted(caps.head_sizes) if caps.head_sizes is not None else list(HEAD_SIZES)
    return [h for h in sizes if h % 2 == 0]


def rotation_head_sizes(caps: BackendCapabilities) -> list[int]:
    """Declared head sizes (the suite's own when any is allowed): ``rotate_heads`` takes every size (``R(D)``'s
    blocks are the largest power of two dividing ``D``: one block at 64, five of 16 at 80)."""
    return sorted(caps.head_sizes) if caps.head_sizes is not None else list(HEAD_SIZES)


def invariance_rotation_sizes(caps: BackendCapabilities) -> list[int]:
    """Head sizes of the ``rotate_heads`` invariance check: 128 where declared (else the smallest), and the first
    declared size that is no power of two (several blocks per vector), if any."""
    sizes = rotation_head_sizes(caps)
    if not sizes:
        return []
    first = 128 if 128 in sizes else sizes[0]
    blocked = [s for s in sizes if s & (s - 1) and s != first]
    return [first, *blocked[:1]]


def graph_capture_sizes(grid: str) -> tuple[int, ...]:
    """Token counts the graph test captures."""
    return (1, 2, 4) if grid == "quick" else (1, 2, 4, 8)


def graph_batch_sizes(grid: str) -> tuple[int, ...]:
    """Decode rows per replayed batch: every captured size plus some that must be padded up to one."""
    return (1, 2, 3, 4) if grid == "quick" else (1, 2, 3, 4, 5, 8)


MOE_ROUTINGS: dict[str, dict[str, object]] = {
    "mixtral": {"renormalize": True},
    "qwen3": {"renormalize": False},
    "sigmoid": {"scoring": "sigmoid", "renormalize": True, "routed_scaling": 2.5},
    "gelu": {"renormalize": False, "activation": "gelu_tanh", "routed_scaling": 0.75},
}
"""Keyword arguments of :class:`paged_core.api.MoERouting` (besides ``num_experts`` and ``top_k``) by name:
Mixtral's (softmax, top-k renormalised), Qwen3-MoE/OLMoE's without ``norm_topk_prob``, a sigmoid router
(renormalised, scaled) and the tanh-GELU gate (scaled)."""
MOE_TOKENS: tuple[int, ...] = (1, 7, 130)
"""Token counts ``T`` of every expert layer of the MoE checks."""
MOE_DISTRIBUTIONS: tuple[str, ...] = ("random", "few_experts", "one_expert", "ties")
"""How the router's logits send tokens: at random (well separated scores), to ``top_k + 1`` experts only (the
others empty), every token's first choice one expert, and logits on a grid of three values (exact ties, which go
to the lower expert id)."""


@dataclass(frozen=True)
class MoEShape:
    """One expert layer of the MoE checks: ``E`` experts, ``top_k``, hidden ``H``, intermediate ``I``, a routing of
    :data:`MOE_ROUTINGS`, and for packed experts the format of ``down`` when it differs from ``gate_up``'s."""

    experts: int
    top_k: int
    hidden: int
    intermediate: int
    routing: str
    down_format: str | None = None

    @property
    def label(self) -> str:
        down = f", down {self.down_format}" if self.down_format else ""
        return f"E={self.experts} k={self.top_k} H={self.hidden} I={self.intermediate} {self.routing}{down}"


MOE_SHAPES: tuple[MoEShape, ...] = (
    MoEShape(4, 1, 64, 32, "qwen3"),
    MoEShape(4, 4, 67, 45, "mixtral"),
    MoEShape(8, 2, 96, 77, "mixtral"),
    MoEShape(8, 8, 64, 48, "sigmoid"),
    MoEShape(60, 4, 128, 64, "qwen3"),
    MoEShape(60, 8, 72, 40, "gelu"),
)
"""Dense expert layers: 4, 8 and 60 experts (Qwen1.5/Qwen2-MoE's 60 with top-4), top-k 1, 2, 4 and 8 (every
expert, for 4 and 8), odd hidden and intermediate sizes, each routing."""
MOE_PACKED_SHAPES: dict[int, tuple[MoEShape, ...]] = {
    1: (MoEShape(8, 2, 67, 45, "mixtral"), MoEShape(60, 4, 128, 64, "qwen3")),
    32: (MoEShape(8, 2, 64, 96, "mixtral"), MoEShape(60, 4, 128, 64, "qwen3")),
    256: (MoEShape(4, 2, 256, 256, "mixtral"), MoEShape(8, 8, 256, 256, "sigmoid")),
}
"""Packed expert layers per block size of the format (``H`` and ``I`` multiples of it)."""
MOE_MIXED_DOWN: dict[str, str] = {"q4_k": "q6_k", "q4_0": "q8_0"}
"""A further layer for these formats with ``down`` in another format (GGUF ``Q4_K_M`` keeps ``q6_k`` down
projections; ``Q4_0`` files ``q8_0`` ones in places), on the first packed shape."""
MOE_INVARIANCE_SHAPE = MoEShape(8, 2, 256, 256, "mixtral")
"""The expert layer of the MoE batch-invariance check (a pool of :data:`INVARIANCE_POOL` tokens)."""


def moe_packed_shapes(fmt: str) -> tuple[MoEShape, ...]:
    """The packed expert layers of format ``fmt``: its block's shapes, then the mixed-format one where listed."""
    shapes = MOE_PACKED_SHAPES[FORMATS_BY_NAME[fmt].block_size]
    if fmt in MOE_MIXED_DOWN:
        first = shapes[0]
        shapes = (
            *shapes,
            MoEShape(first.experts, first.top_k, first.hidden, first.intermediate, "qwen3", MOE_MIXED_DOWN[fmt]),
        )
    return shapes


def iter_universe() -> Iterator[tuple[str, str]]:
    """Every (axis, value) capability row the report lists, declared or not."""
    for d in DTYPES:
        yield "dtype", dtype_name(d)
    for h in HEAD_SIZES:
        yield "head_size", str(h)
    for g in GQA_RATIOS:
        yield "gqa", str(g)
    for k in KINDS:
        yield "batch", k
    for d in KV_DTYPES:
        yield "kv_dtype", dtype_name(d)
    for n in sorted({NUM_KV_HEADS, *KV_HEAD_SWEEP}):
        yield "num_kv_heads", str(n)
    for op in FUSED_OPS:
        yield "fused", op
    yield "fused", "trace"
    yield "fused", "moe"
    yield "structured", "token_bitmask"
    yield "lora", "shrink_expand"
    yield "lora", "trace"
    for name in LINEAR_FORMATS:
        yield "linear_format", name
    yield "linear_format", "fallback"
    for part in INVARIANCE_PARTS:
        yield "batch_invariance", part
