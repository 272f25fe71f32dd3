"""Packed-weight linears (:mod:`paged_core.quant`): weights, input views, the oracle and its tolerance.

The oracle is :func:`paged_core.quant.reference_linear`: the packed weight
dequantized exactly in float32, ``x.float() @ W.T + bias.float()`` in float32,
rounded once to ``x.dtype``. Here each weight is dequantized once (with
``QuantizedWeight.dequantize``, as ``reference_linear`` does) and that
formula applied per call, which gives ``reference_linear``'s result bit for
bit without dequantizing again on every call. The oracle runs on the CPU
whatever the device under test (no TF32, no device library in the oracle).

Tolerance, elementwise, with ``S = |x| @ |W|.T + |bias|`` (the sum of the
absolute products, with the dequantized weight ``W``, in float32)::

    |out - ref| <= 1e-4 * S + 1e-6 + ulp(dtype) * |ref|

``1e-4 * S`` bounds the rounding error of any summation order (blocked, split
over K, fused multiply-add; float32 accumulation of K = 4096 terms stays far
below it) while an error in any single product of one weight of the block
format (a nibble, a scale, a min) does not fit in it. ``ulp`` is 0 for
float32 outputs; for half outputs it is one unit in the last place of the
output, relative: ``2**-7`` for bfloat16 and ``2**-10`` for float16 (twice
the unit roundoffs ``2**-8`` and ``2**-11``): the reference rounds its
float32 sum once, a kernel rounds its own, slightly different, sum once, and
two correct roundings of nearly equal numbers land up to one ulp apart
(half an ulp each side). Rounding activations or weights to a narrower type
than ``x.dtype`` (e.g. quantizing ``x`` to int8, or dequantizing to
bfloat16 for float32 inputs) does not fit in it.

The one rounding a backend may declare: for the formats in its
``q8_activation_formats``, a result also passes when it is within the same
bound of the oracle computed on ``round_activations_q8(x)`` (each 32-wide
block of ``x`` as int8 times an fp32 scale, bit for bit), with ``S`` over
those activations. A wrong nibble, scale or min still fails both.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from paged_conformance.fused import Untouched, column_view, generator, randn
from paged_conformance.grid import LinearWeight, dtype_name
from paged_conformance.tracing import first_line
from paged_core.api import LINEAR_FORMATS as FORMATS
from paged_core.api import FusedOps, PackedLinear, QuantizedWeight
from paged_core.testing import random_packed, round_activations_q8

SUM_ORDER = 1e-4
"""Relative to ``|x| @ |W|.T + |bias|``: room for any summation order."""
ABS_FLOOR = 1e-6
OUTPUT_ULP: dict[torch.dtype, float] = {torch.float32: 0.0, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
"""One unit in the last place of the output, relative to it (0: a float32 output is the accumulator itself)."""
BIAS_SCALE = 0.5
LAYOUT_LABELS: dict[str, str] = {"contiguous": "", "columns": " column slice", "rows": " every other row"}
"""What a call's description adds for each ``x`` layout of :data:`paged_conformance.grid.LINEAR_LAYOUTS`."""

Packer = Callable[[QuantizedWeight, torch.Tensor | None], PackedLinear]
"""A ``pack_linear``: the backend's own, or the reference's (the engine's route for undeclared formats)."""


def declared_formats(ops: FusedOps) -> frozenset[str]:
    """The formats ``ops`` declares it multiplies itself (``linear_formats``), as a frozenset of names (none when
    it is no collection of them: the declaration check fails that)."""
    formats = getattr(ops, "linear_formats", None)
    return frozenset(str(f) for f in formats) if isinstance(formats, (set, frozenset, list, tuple)) else frozenset()


def rounds_activations(ops: FusedOps, fmt: str) -> bool:
    """Whether ``ops`` declares that its ``linear`` may round activations to int8 for ``fmt``."""
    formats: object = getattr(ops, "q8_activation_formats", frozenset())
    return isinstance(formats, (set, frozenset)) and fmt in formats


def check_declaration(ops: FusedOps) -> None:
    """``linear_formats`` is a set of known format names (a typo would silently turn a kernel off), and
    ``q8_activation_formats`` a subset of it."""
    formats = getattr(ops, "linear_formats", None)
    cls = type(ops).__name__
    if not isinstance(formats, (set, frozenset)) or not all(isinstance(f, str) for f in formats):
        raise AssertionError(
            f"{cls}.linear_formats is {formats!r}: it must be a frozenset of format names (known: {', '.join(FORMATS)})"
        )
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise AssertionError(f"{cls}.linear_formats names unknown formats {unknown}; known: {', '.join(FORMATS)}")
    q8: object = getattr(ops, "q8_activation_formats", frozenset())
    if not isinstance(q8, (set, frozenset)) or not all(isinstance(f, str) for f in q8):
        raise AssertionError(f"{cls}.q8_activation_formats is {q8!r}: it must be a frozenset of format names")
    stray = sorted(set(q8) - set(formats))
    if stray:
        raise AssertionError(
            f"{cls}.q8_activation_formats names {stray}, which are not in its linear_formats "
            f"({', '.join(sorted(formats)) or 'none'})"
        )


@functools.lru_cache(maxsize=8)
def pristine(fmt: str, n: int, k: int) -> tuple[QuantizedWeight, torch.Tensor]:
    """A random ``fmt`` weight ``[n, k]`` on the CPU (the same for every dtype) and its exact float32 dequantization.

    Never handed to a backend: :func:`fresh` gives it a copy. Cached, so each
    weight is made and dequantized once per run (the items of one format
    are consecutive).
    """
    gen = generator(zlib.crc32(f"linear-weight-{fmt}-{n}-{k}".encode()))
    w = random_packed(FORMATS[fmt], n, k, gen, name=f"{fmt} [{n}, {k}]")
    return w, w.dequantize()


def fresh(w: QuantizedWeight, device: torch.device) -> QuantizedWeight:
    """A copy of ``w`` (its own bytes) on ``device``."""
    scale = None if w.scale is None else w.scale.to(device, copy=True)
    return QuantizedWeight(w.format, w.shape, w.data.to(device, copy=True), scale, w.name)


def strided_x(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` as a view: ``columns`` (columns 3 .. 3+K of a NaN buffer) or ``rows`` (every other row of one)."""
    if layout == "contiguous":
        return x
    if layout == "columns":
        return column_view(x)
    if layout == "rows":
        buffer = torch.full((2 * x.shape[0], x.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
        view = buffer[::2]
        view.copy_(x)
        return view
    raise ValueError(f"unknown linear layout {layout!r}")


def assert_bytes_unchanged(weight: QuantizedWeight, original: QuantizedWeight, what: str) -> None:
    """Fail if the packed bytes (or ``int8``'s scales) handed to the backend differ from the checkpoint's."""
    for part, now, before in (("data", weight.data, original.data), ("scale", weight.scale, original.scale)):
        if now is None or before is None:
            continue
        a, b = now.detach().cpu().contiguous(), before.contiguous()
        if a.is_floating_point():
            a, b = a.view(torch.int32), b.view(torch.int32)
        if not torch.equal(a, b):
            changed = int((a != b).sum())
            raise AssertionError(
                f"{what} modified the packed weight it was given ({changed}/{b.numel()} elements of its {part} "
                "changed): packed bytes are the checkpoint's and must be left as they are (repack into new memory)"
            )


def tolerance(
    x: torch.Tensor, w_abs: torch.Tensor, bias: torch.Tensor | None, ref: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The elementwise bound of the module docstring, in float32 on the CPU."""
    s = x.float().abs() @ w_abs.T
    if bias is not None:
        s = s + bias.float().abs()
    return SUM_ORDER * s + ABS_FLOOR + OUTPUT_ULP.get(dtype, 2.0**-7) * ref.float().abs()


def _oracle(
    x: torch.Tensor, w32: torch.Tensor, w_abs: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference output for activations ``x`` (any float dtype, on the CPU) in ``dtype``, and its bound."""
    ref = torch.nn.functional.linear(x.float(), w32, None if bias is None else bias.float()).to(dtype)
    return ref, tolerance(x, w_abs, bias, ref, dtype)


def assert_within(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Fail with the worst element (relative to its bound) and how many are outside it."""
    a = got.detach().float().cpu()
    err = (a - ref.float()).abs()
    bad = ~(err <= tol)  # NaN anywhere is bad
    if not bad.any():
        return
    ratio = (err / tol).nan_to_num(float("inf"))
    flat = int(ratio.argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)]
    g, e, t = float(a.reshape(-1)[flat]), float(ref.reshape(-1)[flat]), float(tol.reshape(-1)[flat])
    raise AssertionError(
        f"{what} mismatch: at {index} got {g:.6g}, expected {e:.6g} (error {abs(g - e):.3g}, allowed {t:.3g}); "
        f"{int(bad.sum())}/{bad.numel()} elements outside 1e-4*(|x|@|W|.T+|b|) + 1e-6"
        + ("" if dtype == torch.float32 else " + one output ulp")
        + f" ({dtype_name(dtype)})"
    )


@dataclass
class _Call:
    what: str
    out: torch.Tensor
    ref: torch.Tensor
    tol: torch.Tensor


def _linear(ops: FusedOps, x: torch.Tensor, packed: PackedLinear, shape: tuple[int, int], what: str) -> torch.Tensor:
    """``ops.linear(x, packed)``: a new tensor of ``shape`` in ``x.dtype`` on ``x.device``, ``x``'s buffer untouched."""
    guard = Untouched({"x": x})
    try:
        out = ops.linear(x, packed)
    except Exception as exc:
        raise AssertionError(f"{what} raised {first_line(exc)}") from exc
    guard.check(what)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{what} returned {type(out).__name__}, not a tensor")
    guard.assert_not_aliased([out], what)
    if tuple(out.shape) != shape:
        raise AssertionError(f"{what}: shape {tuple(out.shape)}, expected {shape}")
    if out.dtype != x.dtype:
        raise AssertionError(f"{what}: dtype {out.dtype}, expected the input's {x.dtype}")
    if out.device != x.device:
        raise AssertionError(f"{what}: on {out.device}, the input is on {x.device}")
    return out


def check_weight(
    ops: FusedOps,
    pack: Packer,
    fmt: str,
    spec: LinearWeight,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    packed_by: str = "",
) -> None:
    """Pack one ``fmt`` weight with ``pack``, then call ``ops.linear`` as ``spec`` says and compare with the oracle.

    After packing and after every call the packed bytes must be those the
    checkpoint holds; afterwards every output is compared again (an output
    buffer reused across calls fails) and the bias must be untouched.
    """
    original, w32 = pristine(fmt, spec.n, spec.k)
    weight = fresh(original, device)
    bias = (randn(gen, spec.n) * BIAS_SCALE).to(device, dtype) if spec.bias else None
    bias_cpu = None if bias is None else bias.cpu()
    label = f"{packed_by}{fmt} weight {spec.label}"
    guard = Untouched({"bias": bias})
    try:
        packed = pack(weight, bias)
    except Exception as exc:
        raise AssertionError(f"pack_linear({label}) raised {first_line(exc)}") from exc
    guard.check(f"pack_linear({label})")
    assert_bytes_unchanged(weight, original, f"pack_linear({label})")
    if not isinstance(packed, PackedLinear):
        raise AssertionError(f"pack_linear({label}) returned {type(packed).__name__}, not a PackedLinear")
    if (packed.out_features, packed.in_features) != (spec.n, spec.k):
        raise AssertionError(
            f"pack_linear({label}) gave out/in features ({packed.out_features}, "
            f"{packed.in_features}), expected ({spec.n}, {spec.k})"
        )
    w_abs = w32.abs()
    done: list[_Call] = []
    for m, layout in spec.calls:
        x = randn(gen, m, spec.k).to(dtype)
        what = f"linear(x [{m}, {spec.k}]{LAYOUT_LABELS[layout]}, {label})"
        out = _linear(ops, strided_x(x.to(device), layout), packed, (m, spec.n), what)
        ref, tol = _oracle(x, w32, w_abs, bias_cpu, dtype)
        if rounds_activations(ops, fmt):
            rounded = round_activations_q8(x)
            ref_q8, tol_q8 = _oracle(rounded, w32, w_abs, bias_cpu, dtype)
            try:
                assert_within(out, ref_q8, tol_q8, dtype, what + " (against int8-rounded activations)")
            except AssertionError:
                assert_within(
                    out, ref, tol, dtype, what + " (against exact activations and, failing too, int8-rounded ones)"
                )
            else:
                ref, tol = ref_q8, tol_q8
        else:
            assert_within(out, ref, tol, dtype, what)
        assert_bytes_unchanged(weight, original, what)
        done.append(_Call(what, out, ref, tol))
    for call in done:
        assert_within(call.out, call.ref, call.tol, dtype, f"{call.what}, read back after later calls")
    guard.check(f"linear({label})")
