"""CpuFusedOps: the engine's layer kernels (norms, activation, rotary, head rotation, small-batch linear) as C++ ops.

Every op is a ``torch.ops.paged_cpu`` custom operator with a fake implementation
(:mod:`paged_backend_cpu.ops`), returns new tensors and computes in fp32 with one
rounding to the input dtype at the end, like the reference it overrides.

Above the native kernel's rows, fp32 (and bf16 where oneDNN supports it) goes to oneDNN's
matmul on a weight reordered once at load, which beat torch's linear on MKL 1.1-2.5x from 32
to 1024 rows on the development machine.

``linear`` uses the native kernel (packed weights, fp32 sums) where it was measured to beat
``torch.nn.functional.linear`` (README, "Fused ops"): on a CPU whose best kernels are AVX2,
for bf16 and fp16 weights at every row count measured (1 to 512: torch's half-precision
matmul has no fast path there, the kernel is 3-9x faster), and for fp32 up to 16 rows (MKL's
small-M sgemm is 1.2-4x slower there; from 32 rows on two threads MKL is faster, so torch
keeps those). Elsewhere (CPUs with AVX-512, where torch's own paths were not measured
against these kernels, or with no AVX2) every linear goes to torch on the original weight
unless ``max_rows`` says otherwise.

Packed weights (:class:`~paged_core.quant.QuantizedWeight` in any of ``linear_formats``) are
kept as they are, no copy, and multiplied by ``paged_cpu.quant_linear``, which reads the GGUF
blocks (or int8 rows) in place. ``q4_0`` and ``q4_1`` (``q8_activation_formats``) round ``x`` to
int8 per 32-wide block at every row count and multiply in integer dot products: VNNI tiles of up
to 8 rows, AMX tiles of 16 rows where the CPU has AMX-INT8, with the same bits (off with
``ops.set_linear_activations("fp32")`` or ``PAGED_CPU_LINEAR_ACTIVATIONS=fp32``). The other
formats (and q4 with fp32 activations) dequantize exactly in fp32 and sum in fp32: streaming the
packed rows up to :data:`QUANT_STREAM_MAX_ROWS` rows of x, dequantizing chunks once for more, each
output summed in the same order either way (README, "Packed weights"). Every packed path is
batch-invariant (``batch_invariant_linear``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paged_backend_cpu import fused_moe, ops
from paged_backend_cpu.fused_lora import CpuLoraOps
from paged_core.api import Activation, MoERouting, PackedExperts, PackedLinear, QuantizedWeight, check_moe_inputs

UNLIMITED = 1 << 62
"""A ``max_rows`` that sends every row count to the native kernel."""

KERNEL_MAX_ROWS: dict[str, dict[torch.dtype, int]] = {
    "avx2": {torch.float32: 16, torch.bfloat16: UNLIMITED, torch.float16: UNLIMITED},
}
"""Measured defaults, by the best kernel variant of the CPU: the largest row count ``linear``
sends to the native kernel, per weight dtype (a dtype or variant absent: torch's linear always)."""


QUANT_STREAM_MAX_ROWS: dict[str, dict[str, int]] = {
    "avx2": {"q4_0": 4, "q4_1": 4, "q4_k": 4, "q6_k": 4, "q8_0": 8, "int8": 8},
}
"""Measured defaults, by the best kernel variant of the CPU, per packed format: the largest row count
for which :func:`ops.quant_linear` streams the packed rows (dequantizing them in registers once per
tile of up to 4 rows); more rows dequantize each weight once into fp32 chunks that every row is
multiplied against. The streaming tile covers 4 rows, so the 4-bit formats, whose decoding costs
most, switch right above it; q8_0 and int8 decode cheaply enough to stream two tiles (README,
"Packed weights")."""
QUANT_STREAM_DEFAULT = QUANT_STREAM_MAX_ROWS["avx2"]
"""The same where nothing was measured (other kernel variants): the AVX2 figures."""


INTERLEAVED_FORMATS = frozenset({"q4_0", "q4_1"})
"""Packed formats that also get a copy with rows in groups of 8 at load (:func:`ops.interleave_q4`), which
the int8-activation path reads at every row count: 8 features per vector, so no per-row scale gathers or horizontal
sums (README, "Packed weights"). It costs a second copy of those weights in memory."""


def default_quant_stream_rows() -> dict[str, int]:
    """:data:`QUANT_STREAM_MAX_ROWS` for this CPU's best kernel variant."""
    return dict(QUANT_STREAM_MAX_ROWS.get(ops.supported_isas()[0], QUANT_STREAM_DEFAULT))


@dataclass(frozen=True)
class CpuQuantWeight:
    """What :meth:`CpuFusedOps.pack_linear` adds for a packed :class:`~paged_core.quant.QuantizedWeight`.

    Nothing is copied: ``data`` and ``scale`` are the weight's own tensors, which the kernel reads in
    their packed layout; ``fmt`` is the format's :data:`ops.QUANT_FORMATS` id.
    """

    fmt: int
    data: torch.Tensor
    scale: torch.Tensor | None
    stream_rows: int
    """Row counts up to this stream the packed rows, larger ones dequantize first (:data:`QUANT_STREAM_MAX_ROWS`)."""
    out_features: int
    """The weight's rows, kept here: ``linear`` runs per projection per step, where a property call shows."""
    interleaved: torch.Tensor | None = None
    """q4_0 / q4_1 with rows in groups of 8 (:func:`ops.interleave_q4`), what decoding reads with int8
    activations: a second copy of the weight (``None`` for other formats, or rows not a multiple of 8)."""


@dataclass(frozen=True)
class CpuPackedWeight:
    """What :meth:`CpuFusedOps.pack_linear` adds to a :class:`PackedLinear`.

    ``panels`` is ``[ceil(N / 16), K, 16]`` in the weight's dtype for the native kernel (rows up to
    ``max_rows``; ``None`` where it is not used); ``onednn`` is the weight reordered once for
    oneDNN's matmul (``torch.ops.mkldnn._linear_pointwise``) for larger batches, where oneDNN
    supports the dtype on this CPU. Each is another copy of the weight beside the original.
    """

    panels: torch.Tensor | None
    max_rows: int
    onednn: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    """A contiguous copy of the bias for oneDNN (which ignores strides)."""


_QUANT_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

ONEDNN_BATCH_HINT = 256
"""The batch size oneDNN's weight layout is chosen for (prefill chunks and large decode batches)."""
ONEDNN_MIN_ROWS = 17
"""Fewer rows never go to oneDNN's packed path (it measured far slower than torch's linear at 1-16 rows)."""


def _onednn_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's prepacked layout, or ``None`` where this CPU or dtype has no such path.

    Measured on the AVX2 development machine (fp32, 2 threads, README "Fused ops"): 1.1-2.5x
    torch's MKL linear from 32 to 1024 rows. For bf16, oneDNN needs AVX-512 (it refuses here).
    """
    if not torch.backends.mkldnn.is_available() or weight.dtype not in (  # type: ignore[no-untyped-call]
        torch.float32,
        torch.bfloat16,
    ):
        return None
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ONEDNN_BATCH_HINT)
    except RuntimeError:
        return None
    return packed


def default_max_rows() -> dict[torch.dtype, int]:
    """:data:`KERNEL_MAX_ROWS` for this CPU's best kernel variant (empty where nothing was measured)."""
    return dict(KERNEL_MAX_ROWS.get(ops.supported_isas()[0], {}))


class CpuFusedOps(CpuLoraOps):
    """The reference's layer ops, overridden by the cpu backend's C++ kernels (the multi-LoRA pair in
    :class:`~paged_backend_cpu.fused_lora.CpuLoraOps`).

    ``max_rows`` overrides :func:`default_max_rows` (per weight dtype; a dtype left out never
    uses the native linear), for measurements and tests. It is read by :meth:`pack_linear`:
    only weights packed for the native kernel carry the second copy.
    """

    name = "cpu"
    linear_formats = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "int8"})
    q8_activation_formats = frozenset({"q4_0", "q4_1"})
    """At every row count these round ``x`` to int8 per 32-wide block unless ``ops.set_linear_activations('fp32')``
    (or ``PAGED_CPU_LINEAR_ACTIVATIONS=fp32``) says not to (README, "Packed weights")."""
    batch_invariant_linear = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "int8"})
    """Every packed format, in either activation mode: int8 activations follow one rule at every row count
    (csrc/quant_x8_body.h; the AMX tiles give the same bits), and the exact fp32 paths sum each output in the
    same order whether they stream or dequantize (csrc/quant_body.h). No dense dtype: above the native
    kernel's rows, oneDNN and torch choose their GEMM blocking, and so each row's summation order, by the
    row count."""
    batch_invariant_layer_ops = True
    """The five layer ops (the norms, ``silu_and_mul``, ``rotary`` and ``rotate_heads``) are C++ loops over rows,
    each row's arithmetic fixed by its own length."""
    moe_formats = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "int8"})
    """Every packed format of ``linear_formats``, for routed experts too (``paged_cpu::moe``, csrc/moe_ops.cpp): each
    expert's rows go through the kernels ``quant_linear`` runs, q4_0 / q4_1 with int8 activations unless
    ``linear_activations()`` is ``fp32`` (one int8 level where linears take two with ``int8x2``: the contract's
    declared rounding, which the conformance suite's MoE oracle holds kernels to)."""
    batch_invariant_moe = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "int8", "float32", "bfloat16", "float16"})
    """Every kind ``moe`` serves: the packed kernels' rule per row, dense experts through row kernels of the same
    rule (blocks of 32 inputs, sums in an order fixed by the layer's sizes), activations rounded per row, each
    token's slots summed in order."""

    def __init__(
        self,
        max_rows: dict[torch.dtype, int] | None = None,
        onednn: bool = True,
        quant_stream_rows: dict[str, int] | None = None,
        interleave: bool = True,
    ) -> None:
        self.max_rows = default_max_rows() if max_rows is None else dict(max_rows)
        self.onednn = onednn
        self.quant_stream_rows = default_quant_stream_rows()
        if quant_stream_rows is not None:
            self.quant_stream_rows.update(quant_stream_rows)
        self.interleave = interleave
        """Whether ``pack_linear`` adds the interleaved copy of q4_0 / q4_1 weights (:data:`INTERLEAVED_FORMATS`)."""

    def apply_token_bitmask(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | torch.Tensor
    ) -> None:
        """Structured outputs' mask in place: one C++ pass per row, whole 32-token words at a time where the grammar
        allows all or none of them (most words), single-threaded (csrc/token_bitmask.cpp). Logits off the CPU, or
        of a dtype the kernel does not take, go to the reference."""
        if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            super().apply_token_bitmask(logits, bitmask, rows)
            return
        index = torch.as_tensor(rows, dtype=torch.long)
        if index.numel():
            ops.apply_token_bitmask(logits, bitmask.contiguous(), index.contiguous())

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMS normalisation of ``[T, H]`` over ``H``, times ``weight`` ``[H]``: one native pass."""
        return ops.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(x + residual), x + residual)`` in one native pass."""
        return ops.add_rms_norm(x, residual, weight, eps)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of a merged gate/up projection ``[T, 2I]``."""
        return ops.silu_and_mul(x)

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """NeoX rotary of ``query`` and ``key`` at ``positions``; new contiguous ``(q, k)``."""
        return ops.rotary(positions, query, key, cos_sin_cache)

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Each head vector of ``x`` ``[T, H, D]`` times ``R(D)`` (``paged_core.api.head_rotation``): the fast
        Walsh-Hadamard butterfly per vector, in the reference backend's order (the same bits, in any batch),
        8-lane permutes for its first three stages on AVX2; a new contiguous ``[T, H, D]``."""
        return ops.rotate_heads(x)

    def pack_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> PackedLinear:
        """Keep the weight, and for a dtype the native kernel serves, add a packed copy (same size again).

        A :class:`~paged_core.quant.QuantizedWeight` of a declared format on the CPU is kept as it is
        (no copy): the kernel reads its bytes in place. Any other one is the reference's.
        """
        if isinstance(weight, QuantizedWeight):
            name = weight.format.name
            if name not in self.linear_formats or weight.device.type != "cpu":
                return super().pack_linear(weight, bias)
            rows = self.quant_stream_rows.get(name, 4)
            fid = ops.QUANT_FORMATS[name]
            interleaved = None
            if self.interleave and name in INTERLEAVED_FORMATS and weight.out_features % 8 == 0:
                interleaved = ops.interleave_q4(weight.data, fid)
            quant = CpuQuantWeight(fid, weight.data, weight.scale, rows, weight.out_features, interleaved)
            return PackedLinear(weight, bias, quant)
        if weight.dim() != 2 or weight.device.type != "cpu":
            return PackedLinear(weight, bias)
        rows = self.max_rows.get(weight.dtype, 0)
        panels = ops.pack_linear(weight.detach()) if rows > 0 else None
        big = _onednn_weight(weight) if self.onednn and rows < UNLIMITED else None
        if panels is None and big is None:
            return PackedLinear(weight, bias)
        flat_bias = bias.detach().contiguous() if bias is not None and big is not None else None
        return PackedLinear(weight, bias, CpuPackedWeight(panels, max(rows, 0), big, flat_bias))

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        """``x @ weight.T + bias``: the native kernel for few rows of a packed weight, else torch's linear."""
        p = packed.packed
        if isinstance(p, CpuQuantWeight) and x.dim() == 2 and x.dtype in _QUANT_X_DTYPES:
            return ops.quant_linear(
                x, p.data, p.scale, packed.bias, p.fmt, p.out_features, p.stream_rows, p.interleaved
            )
        if isinstance(p, CpuPackedWeight) and isinstance(packed.weight, torch.Tensor) and x.dim() == 2:
            if p.panels is not None and x.shape[0] <= p.max_rows:
                return ops.linear(x, p.panels, packed.bias, packed.out_features)
            # Inductor cannot lower oneDNN's call on an opaque reordered weight; under compile torch's
            # linear on the original weight lets it pick its own GEMM.
            if (
                p.onednn is not None
                and x.shape[0] >= ONEDNN_MIN_ROWS
                and x.dtype == packed.weight.dtype
                and not torch.compiler.is_compiling()
            ):
                out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x.contiguous(), p.onednn, p.bias, "none", [], "")
                return out
        return super().linear(x, packed)

    def pack_experts(
        self, gate_up: torch.Tensor | QuantizedWeight, down: torch.Tensor | QuantizedWeight
    ) -> PackedExperts:
        """Keep the experts as they are (packed rows in place; q4_0 / q4_1 also in groups of 8 rows, a second copy,
        as ``pack_linear``); layouts that do not fit are refused by :class:`PackedExperts`. Experts on another device
        or of a dtype the op does not read are the reference's."""
        experts = PackedExperts(gate_up, down)
        packed = fused_moe.pack(experts, self.moe_formats, self.quant_stream_rows, self.interleave)
        return experts if packed is None else PackedExperts(gate_up, down, packed)

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        """The base's ``moe`` (the same refusals, then :meth:`experts`) with the routing in one C++ op,
        ``paged_cpu::moe_route`` (:func:`fused_moe.route`: ``route_experts``' ids and weights, one call instead of a
        dozen small torch ops a layer)."""
        check_moe_inputs(x, router_logits, experts, routing)
        weights, ids = fused_moe.route(router_logits, routing)
        return self.experts(x, weights, ids, experts, routing.activation)

    def experts(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        experts: PackedExperts,
        activation: Activation = "silu",
    ) -> torch.Tensor:
        """Routed experts by ``paged_cpu::moe`` (one C++ op: tokens grouped by expert, only the chosen experts' bytes
        read); ``moe`` routes (``paged_cpu::moe_route``) and calls this. Experts this class did not pack go to the
        reference."""
        if not fused_moe.serves(x, experts):
            return super().experts(x, weights, ids, experts, activation)
        return fused_moe.experts(x, weights, ids, experts, activation)
