"""The C++ operators (``torch.ops.paged_cpu``), their fake implementations, and the ISA switch.

The layer ops (``rms_norm`` ... ``linear``) serve :class:`paged_backend_cpu.fused.CpuFusedOps`;
each returns new tensors and never modifies its inputs.

Importing this module loads the extension; if it cannot be loaded, :data:`LOAD_ERROR`
says why and the backend reports itself unavailable instead of failing at import.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import torch

LOAD_ERROR: str | None = None
try:
    importlib.import_module("paged_backend_cpu._C")  # runs the C++ registrations of torch.ops.paged_cpu
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    LOAD_ERROR = f"the C++ extension paged_backend_cpu._C failed to load: {exc}"


PANEL = 16
"""Output features per panel of a packed linear weight (``kPanel`` in csrc/fused_api.h)."""

QUANT_FORMATS: dict[str, int] = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "q4_k": 3, "q6_k": 4, "int8": 5}
"""The ``fmt`` ids of :func:`quant_linear`, by :mod:`paged_core.quant` format name (``QFormat`` in csrc/fused_api.h)."""


def _attention_fake(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    split_tokens: int = 0,
    sliding_window: int = 0,
    soft_cap: float = 0.0,
) -> torch.Tensor:
    """Shape and dtype of ``attention``'s result, for tracing: a new contiguous tensor like ``query``."""
    return query.new_empty(query.shape)


def _no_result(*args: object) -> None:
    """``write_kv``, ``copy_blocks``, ``apply_token_bitmask`` and ``lora_expand`` only mutate an argument."""


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


def _add_rms_norm_fake(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _silu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] // 2))


def _rotary_fake(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return query.new_empty(query.shape), key.new_empty(key.shape)


def _rotate_heads_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _pack_linear_fake(weight: torch.Tensor) -> torch.Tensor:
    return weight.new_empty(((weight.shape[0] + PANEL - 1) // PANEL, weight.shape[1], PANEL))


def _linear_fake(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def _quant_linear_fake(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    fmt: int,
    out_features: int,
    stream_rows: int,
    interleaved: torch.Tensor | None = None,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def _lora_shrink_fake(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], a.shape[1]), dtype=torch.float32)


if LOAD_ERROR is None:
    torch.library.register_fake("paged_cpu::attention", _attention_fake)
    torch.library.register_fake("paged_cpu::write_kv", _no_result)
    torch.library.register_fake("paged_cpu::copy_blocks", _no_result)
    torch.library.register_fake("paged_cpu::apply_token_bitmask", _no_result)
    torch.library.register_fake("paged_cpu::rms_norm", _rms_norm_fake)
    torch.library.register_fake("paged_cpu::add_rms_norm", _add_rms_norm_fake)
    torch.library.register_fake("paged_cpu::silu_and_mul", _silu_and_mul_fake)
    torch.library.register_fake("paged_cpu::rotary", _rotary_fake)
    torch.library.register_fake("paged_cpu::rotate_heads", _rotate_heads_fake)
    torch.library.register_fake("paged_cpu::pack_linear", _pack_linear_fake)
    torch.library.register_fake("paged_cpu::linear", _linear_fake)
    torch.library.register_fake("paged_cpu::quant_linear", _quant_linear_fake)
    torch.library.register_fake("paged_cpu::lora_shrink", _lora_shrink_fake)
    torch.library.register_fake("paged_cpu::lora_expand", _no_result)


def attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    split_tokens: int = 0,
    sliding_window: int = 0,
    soft_cap: float = 0.0,
) -> torch.Tensor:
    """Causal paged attention of ``query`` ``[T, H, D]`` for every row; returns a new ``[T, H, D]`` in its dtype.

    ``split_tokens`` > 0 forces the length of key splits (normally 512 keys, at fixed key positions whatever
    the batch, so that each row's result is batch-invariant); tests use it to exercise the split reduction.
    ``sliding_window`` > 0: key ``j`` is visible from position ``i`` iff ``i - sliding_window < j <= i``, and
    keys before a row's first window are never read (their block-table entries may be anything in range).
    ``soft_cap`` > 0 maps each scaled score ``s`` to ``soft_cap * tanh(s / soft_cap)`` before the softmax.
    An int8 / float8 ``kv_cache`` (:func:`write_kv`'s quantized layout, see :mod:`paged_backend_cpu.layout`) is
    dequantized on the fly, in fp32.
    """
    out: torch.Tensor = torch.ops.paged_cpu.attention(
        query, kv_cache, query_start_loc, seq_lens, block_table, scale, split_tokens, sliding_window, soft_cap
    )
    return out


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, KVH, D]`` at int64 ``slot_mapping`` (-1 skipped), in the cache's dtype.

    An int8 / float8 cache (``[2, blocks, KVH, block_size, D + 2]``) gets each vector quantized with its own
    float16 scale exactly as :func:`paged_core.api.quantize_kv` does (:mod:`paged_backend_cpu.layout` says where).
    """
    torch.ops.paged_cpu.write_kv(key, value, kv_cache, slot_mapping)


def copy_blocks(kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
    """Copy whole blocks, keys and values, for each int64 (source, destination) pair in every cache."""
    torch.ops.paged_cpu.copy_blocks(kv_caches, src_to_dst)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """-inf in place on ``logits[rows[i], t]`` ([batch, vocab], fp32/bf16/fp16) for each token ``t`` that int32
    ``bitmask[i]`` does not allow (bit ``t % 32`` of word ``t // 32``), and past the bitmask's last token."""
    torch.ops.paged_cpu.apply_token_bitmask(logits, bitmask, rows)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the rows of ``x`` ``[T, H]``; a new ``[T, H]`` in ``x.dtype``."""
    out: torch.Tensor = torch.ops.paged_cpu.rms_norm(x, weight, eps)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` (rounded to ``x.dtype``); returns new ``(rms_norm(s, weight, eps), s)``."""
    normed, summed = torch.ops.paged_cpu.add_rms_norm(x, residual, weight, eps)
    return normed, summed


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` ``[T, 2I]``; a new ``[T, I]``."""
    out: torch.Tensor = torch.ops.paged_cpu.silu_and_mul(x)
    return out


def rotary(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotary of ``query`` ``[T, Hq, D]`` and ``key`` ``[T, Hk, D]`` at ``positions``; new ``(q, k)``.

    ``cos_sin_cache`` is ``[max_position, D]``: cos in the first half of each row, sin in the second.
    """
    q, k = torch.ops.paged_cpu.rotary(positions, query, key, cos_sin_cache)
    return q, k


def rotate_heads(x: torch.Tensor) -> torch.Tensor:
    """Each head vector of ``x`` ``[T, H, D]`` (any strides) times ``paged_core.api.head_rotation(D)``; a new
    contiguous ``[T, H, D]`` in ``x.dtype``.

    The fast Walsh-Hadamard butterfly in float32, in the order of the reference backend's (the same bits),
    then times ``1 / sqrt(b)`` and rounded once.
    """
    out: torch.Tensor = torch.ops.paged_cpu.rotate_heads(x)
    return out


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[N, K]`` as panels ``[ceil(N / 16), K, 16]`` of its dtype, the layout :func:`linear` reads."""
    out: torch.Tensor = torch.ops.paged_cpu.pack_linear(weight)
    return out


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``x @ weight.T + bias`` from a :func:`pack_linear` weight, fp32 sums; a new ``[T, N]`` in ``x.dtype``."""
    out: torch.Tensor = torch.ops.paged_cpu.linear(x, packed, bias, out_features)
    return out


def quant_linear(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    fmt: int,
    out_features: int,
    stream_rows: int,
    interleaved: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias`` for a packed ``W`` read in place (``data`` and ``scale`` of a ``QuantizedWeight``).

    ``fmt`` is a :data:`QUANT_FORMATS` id; a new ``[T, out_features]`` in ``x.dtype``. q4_0 and q4_1 follow
    :func:`linear_activations` at every row count (int8 modes: integer dot products over the rounded rows, reading
    ``interleaved``, the same weight in groups of 8 rows from :func:`interleave_q4`, where given and the build has
    that kernel); ``stream_rows`` does not apply to them then. Otherwise weights are dequantized exactly in fp32
    and the products summed in fp32: up to ``stream_rows`` rows the packed rows are streamed once per tile of 4
    rows and dequantized in registers; above, dequantized once into fp32 chunks that every row is multiplied
    against, each output summed in the same order either way.
    """
    out: torch.Tensor = torch.ops.paged_cpu.quant_linear(
        x, data, scale, bias, fmt, out_features, stream_rows, interleaved
    )
    return out


def interleave_q4(data: torch.Tensor, fmt: int) -> torch.Tensor:
    """q4_0 / q4_1 rows ``[N, K / 32 * bytes]`` (``N`` a multiple of 8) repacked in groups of 8 rows, the layout
    :func:`quant_linear` reads as ``interleaved``: per group and block of 32 weights the 8 rows' fp16 ``d``
    (q4_1: then their 8 ``m``), then 4 vectors of 32 bytes, vector ``g`` holding bytes ``4g .. 4g + 3`` of
    each row's nibbles (csrc/quant_x8_body.h). A new ``[N / 8, K / 32 * 8 * bytes]`` uint8 tensor."""
    scales = {QUANT_FORMATS["q4_0"]: 2, QUANT_FORMATS["q4_1"]: 4}
    if fmt not in scales:
        raise ValueError(f"interleave_q4: fmt {fmt} is not q4_0 or q4_1")
    head = scales[fmt]
    n, row_bytes = data.shape
    block = head + 16
    if n % 8 or row_bytes % block:
        raise ValueError(
            f"interleave_q4: {n} rows of {row_bytes} bytes are not groups of 8 rows of {block}-byte blocks"
        )
    blocks = row_bytes // block
    t = data.reshape(n // 8, 8, blocks, block).permute(0, 2, 1, 3)  # [groups, blocks, row, block bytes]
    parts = [t[..., 0:2].reshape(n // 8, blocks, 16)]  # the 8 rows' d
    if head == 4:
        parts.append(t[..., 2:4].reshape(n // 8, blocks, 16))  # their m
    nibbles = t[..., head:].reshape(n // 8, blocks, 8, 4, 4).permute(0, 1, 3, 2, 4)  # [.., vector g, row, byte]
    parts.append(nibbles.reshape(n // 8, blocks, 128))
    return torch.cat(parts, dim=-1).reshape(n // 8, -1).contiguous()


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Multi-LoRA shrink: a new fp32 ``[T, R]``, row ``t`` = ``x[t] @ a[slots[t]].T`` (0 where ``slots[t] < 0``).

    ``x`` ``[T, K]``, ``a`` ``[S, R, K]`` and ``slots`` int64 ``[T]`` on the CPU; ``x`` and ``a`` fp32, bf16 or fp16.
    Runs of at least 16 consecutive tokens of one slot (and slots with 16 scattered tokens) are one GEMM each, the
    other tokens go through the row kernels (csrc/lora_ops.cpp); :func:`lora_expand` does the same from 8.
    """
    out: torch.Tensor = torch.ops.paged_cpu.lora_shrink(x, a, slots)
    return out


def lora_expand(y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """Multi-LoRA expand in place: ``y[t] += shrunk[t] @ b[slots[t]].T``, summed in fp32 and rounded once to
    ``y.dtype``; rows with ``slots[t] < 0`` untouched. ``b`` is ``[S, N, R]``, ``shrunk`` ``[T, R]``."""
    torch.ops.paged_cpu.lora_expand(y, shrunk, b, slots)


def linear_activations() -> str:
    """How :func:`quant_linear` multiplies q4_0 and q4_1 weights, at every row count: ``int8x2``, ``int8`` or ``fp32``.

    ``int8`` rounds each row of ``x`` to int8 per 32-wide block (:func:`paged_core.testing.round_activations_q8`)
    and multiplies the blocks' integers in integer dot products; ``int8x2`` (the default) also rounds what that
    left, by the same rule, and adds the two products (about 15 bits per block: the embedded model answers as
    its fp32 dequantized self does, where one level answered "What is the capital of France?" with "L'Étoile");
    ``fp32`` keeps the activations exact. Every mode is batch-invariant. ``PAGED_CPU_LINEAR_ACTIVATIONS`` sets it
    at load time.
    """
    mode: str = torch.ops.paged_cpu.linear_activations()
    return mode


def set_linear_activations(mode: str) -> str:
    """Choose :func:`linear_activations` (``int8x2``, ``int8`` or ``fp32``) for every later call; returns it."""
    chosen: str = torch.ops.paged_cpu.set_linear_activations(mode)
    return chosen


def quant_q8_isa() -> str:
    """The kernels of the int8-activation path: ``vnni`` (AVX-512 VNNI, chosen where the CPU has it), ``avx2``
    or ``scalar`` (a build forced by :func:`set_quant_isa` uses its own)."""
    name: str = torch.ops.paged_cpu.quant_q8_isa()
    return name


def quant_amx() -> bool:
    """Whether the int8-activation path multiplies 16 rows at a time on AMX tiles (same bits as its VNNI
    tiles): the CPU has AMX-INT8, Linux grants the tile state, and ``PAGED_CPU_AMX`` is not ``0``."""
    used: bool = torch.ops.paged_cpu.quant_amx()
    return used


def fused_isa() -> str:
    """The layer kernels in use: ``scalar`` when :func:`set_isa` chose it (or no AVX2), else ``avx2``."""
    name: str = torch.ops.paged_cpu.fused_isa()
    return name


def quant_isa() -> str:
    """The packed-weight kernels in use (:func:`quant_linear`): ``avx2`` or ``scalar`` by default, ``avx512`` if set."""
    name: str = torch.ops.paged_cpu.quant_isa()
    return name


def set_quant_isa(name: str) -> str:
    """Choose the packed-weight kernels: ``auto`` (those of the layer kernels), ``avx512``, ``avx2``, ``scalar``.

    The 16-lane ``avx512`` build is never chosen automatically (measured no faster on AVX-512 Zen 4);
    one the CPU lacks is refused naming the available ones. Returns the kernels now in use.
    """
    chosen: str = torch.ops.paged_cpu.set_quant_isa(name)
    return chosen


def isa() -> str:
    """The kernel variant in use: ``avx512bf16``, ``avx512``, ``avx2`` or ``scalar``."""
    name: str = torch.ops.paged_cpu.isa()
    return name


def set_isa(name: str) -> str:
    """Use another kernel variant (``auto`` = the best this CPU runs); refuses one the CPU lacks. Returns the new one.

    The environment variable ``PAGED_CPU_ISA`` does the same at load time.
    """
    chosen: str = torch.ops.paged_cpu.set_isa(name)
    return chosen


def supported_isas() -> list[str]:
    """Kernel variants this CPU can run, best first."""
    names: list[str] = torch.ops.paged_cpu.supported_isas()
    return names


MOE_DENSE = -1
"""The ``fmt`` of a :class:`MoEProjection` of dense expert weights (``[E, N, K]`` fp32, bf16 or fp16)."""
MOE_ACTIVATIONS: dict[str, int] = {"silu": 0, "gelu_tanh": 1}
"""The ``activation`` ids of :func:`moe`, by :class:`paged_core.api.MoERouting` activation name."""


class MoEProjection(NamedTuple):
    """One projection of a MoE layer's experts as :func:`moe` reads them (the op's arguments, in order).

    ``fmt`` is a :data:`QUANT_FORMATS` id with ``data`` the experts' packed rows stacked (``E * N`` rows: a
    :class:`~paged_core.api.QuantizedWeight`'s bytes, ``scale`` its int8 row scales, ``interleaved`` the q4_0 / q4_1
    copy of :func:`interleave_q4` or ``None``), or :data:`MOE_DENSE` with ``data`` ``[E, N, K]``. ``stream_rows``
    is :func:`quant_linear`'s, per expert's rows.
    """

    data: torch.Tensor
    scale: torch.Tensor | None
    interleaved: torch.Tensor | None
    fmt: int
    stream_rows: int


def _moe_fake(x: torch.Tensor, *args: object) -> torch.Tensor:
    return x.new_empty(x.shape)


if LOAD_ERROR is None:
    torch.library.register_fake("paged_cpu::moe", _moe_fake)


def moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: MoEProjection,
    down: MoEProjection,
    activation: int,
) -> torch.Tensor:
    """Routed experts of ``x`` ``[T, H]`` for a routing computed before: ``weights`` float32 and ``ids`` int32
    ``[T, k]`` (each in ``0 .. E - 1``, else refused); a new ``[T, H]`` in ``x.dtype`` (csrc/moe_ops.cpp).

    ``gate_up`` has ``2I`` rows per expert (its gate rows, then its up rows), ``down`` ``H``. Each expert's rows
    are multiplied as :func:`quant_linear` multiplies a weight (q4_0 / q4_1 with the int8 activations of
    :func:`linear_activations`), the gated ``activation`` (a :data:`MOE_ACTIVATIONS` id) between; each token's
    ``k`` outputs times its weights are summed in slot order in fp32 and rounded once. Every token's bits are its
    own (batch-invariant).
    """
    out: torch.Tensor = torch.ops.paged_cpu.moe(x, weights, ids, *gate_up, *down, activation)
    return out


MOE_SCORINGS: dict[str, int] = {"softmax": 0, "sigmoid": 1}
"""The ``scoring`` ids of :func:`moe_route`, by :class:`paged_core.api.MoERouting` scoring name."""


def _moe_route_fake(
    logits: torch.Tensor, top_k: int, scoring: int, renormalize: bool, routed_scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (logits.shape[0], top_k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int32)


if LOAD_ERROR is None:
    torch.library.register_fake("paged_cpu::moe_route", _moe_route_fake)


def moe_route(
    logits: torch.Tensor, top_k: int, scoring: int, renormalize: bool, routed_scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`paged_core.api.route_experts` in one op: new ``(weights [T, k] float32, ids [T, k] int32)`` from router
    ``logits`` ``[T, E]`` (fp32, bf16 or fp16, any strides) on the CPU; ``scoring`` a :data:`MOE_SCORINGS` id.

    The same ids in the same slots (the ``k`` largest logits, largest first, an exact tie to the lower expert id).
    The weights are route_experts' bits for softmax scoring on x86-64 (its softmax and renormalising sum re-traced
    lane for lane for the CPU capability torch dispatches to, csrc/moe_route.cpp). Sigmoid weights are too, but for
    the logits torch's elementwise kernel leaves to its scalar loop (a batch's last ``(T * E) % 32`` with AVX-512),
    whose other exp can move a weight by up to 4 ulps: the op uses the vector loop's exp for every logit, so that
    each token's result is its own (batch-invariant).
    """
    weights, ids = torch.ops.paged_cpu.moe_route(logits, top_k, scoring, renormalize, routed_scaling)
    return weights, ids
