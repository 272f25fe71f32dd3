"""The fused layer ops a backend returns from ``fused_ops()`` against the reference ``FusedOps()``.

Every op, at every declared dtype, over a sweep of shapes (odd sizes and
sizes no multiple of 8 or 16 among them), once with contiguous inputs and
once with every input a view (``-strided``: column slices of wider
buffers, q and k slices of one merged QKV output, a transposed weight).
Each call must return new tensors in the input's dtype and shape, within
the dtype's tolerance of the reference, and leave every input's buffer
bit-identical; ``rotate_heads`` applied twice must give its input back. A
backend that keeps the reference passes trivially, except the trace check:
each op is also compiled whole with ``torch.compile(fullgraph=True,
backend="aot_eager")``, as a compiled or captured step holds it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from paged_conformance.fused import (
    REFERENCE,
    Untouched,
    as_tuple,
    assert_close,
    assert_rope_cache_untouched,
    check_call,
    column_view,
    generator,
    head_major_view,
    linear_weight,
    norm_rows,
    norm_weight,
    positions,
    qkv_views,
    randn,
    rope_cache,
    spaced_view,
    transposed_view,
)
from paged_conformance.grid import (
    FUSED_OPS,
    FUSED_TOKENS,
    LINEAR_SHAPES,
    LINEAR_TOKENS,
    NORM_EPS,
    NORM_HIDDEN,
    ROTARY_HEADS,
    ROTATION_HEADS,
    SILU_INTERMEDIATE,
    FusedCase,
    rotary_head_sizes,
    rotation_head_sizes,
)
from paged_conformance.session import Conformance
from paged_conformance.tracing import HostReads, first_line, own_entry
from paged_core.api import FusedOps, PackedLinear


def _norm_inputs(
    fused: FusedCase, gen: torch.Generator, device: torch.device, tokens: int, hidden: int, residual: bool
) -> dict[str, torch.Tensor]:
    x = norm_rows(gen, tokens, hidden).to(device, fused.dtype)
    tensors = {"x": x}
    if residual:
        tensors["residual"] = norm_rows(gen, tokens, hidden).to(device, fused.dtype)  # so sums are tiny, large, 0
    tensors["weight"] = norm_weight(gen, hidden).to(device, fused.dtype)
    if fused.layout == "strided":
        tensors = {k: spaced_view(t) if t.dim() == 1 else column_view(t) for k, t in tensors.items()}
    return tensors


@pytest.mark.paged_capability("fused:rms_norm")
@pytest.mark.paged_cases("fused")
def test_rms_norm(conformance: Conformance, fused: FusedCase) -> None:
    """``rms_norm`` of rows from 1e-3 to 40 in magnitude (and a zero row), at each ``eps``, matches the reference."""
    ops, gen = conformance.fused_ops(), generator(fused.seed)
    for tokens, hidden, eps in itertools.product(FUSED_TOKENS, NORM_HIDDEN, NORM_EPS):
        tensors = _norm_inputs(fused, gen, conformance.device, tokens, hidden, residual=False)
        check_call(
            f"rms_norm(x [{tokens}, {hidden}], eps={eps:g})",
            fused.dtype,
            ops.rms_norm,
            REFERENCE.rms_norm,
            tensors,
            [(tokens, hidden)],
            extra=(eps,),
        )


@pytest.mark.paged_capability("fused:add_rms_norm")
@pytest.mark.paged_cases("fused")
def test_add_rms_norm(conformance: Conformance, fused: FusedCase) -> None:
    """``add_rms_norm`` returns the normalised sum and the sum as new tensors (the residual is not updated in place)."""
    ops, gen = conformance.fused_ops(), generator(fused.seed)
    for tokens, hidden, eps in itertools.product(FUSED_TOKENS, NORM_HIDDEN, NORM_EPS):
        tensors = _norm_inputs(fused, gen, conformance.device, tokens, hidden, residual=True)
        check_call(
            f"add_rms_norm(x [{tokens}, {hidden}], eps={eps:g})",
            fused.dtype,
            ops.add_rms_norm,
            REFERENCE.add_rms_norm,
            tensors,
            [(tokens, hidden)] * 2,
            extra=(eps,),
        )


@pytest.mark.paged_capability("fused:silu_and_mul")
@pytest.mark.paged_cases("fused")
def test_silu_and_mul(conformance: Conformance, fused: FusedCase) -> None:
    """``silu_and_mul`` of ``[T, 2I]``: ``silu`` of the first half (gate) times the second (up)."""
    ops, gen = conformance.fused_ops(), generator(fused.seed)
    for tokens, inter in itertools.product(FUSED_TOKENS, SILU_INTERMEDIATE):
        x = randn(gen, tokens, 2 * inter, scale=3.0).to(conformance.device, fused.dtype)
        if fused.layout == "strided":
            x = column_view(x)
        check_call(
            f"silu_and_mul(x [{tokens}, {2 * inter}])",
            fused.dtype,
            ops.silu_and_mul,
            REFERENCE.silu_and_mul,
            {"x": x},
            [(tokens, inter)],
        )


@pytest.mark.paged_capability("fused:rotary")
@pytest.mark.paged_cases("fused")
def test_rotary(conformance: Conformance, fused: FusedCase) -> None:
    """NeoX rotary of q and k at unsorted positions up to the cache's last row, each declared head size and GQA shape.

    The cos/sin cache is float32 ``[32768, D]`` (cos halves, then sin halves);
    ``-strided`` passes q and k as slices of one merged QKV projection output.
    """
    sizes = rotary_head_sizes(conformance.caps)
    if not sizes:
        pytest.skip("N/A: no even head size declared")
    ops, gen, device = conformance.fused_ops(), generator(fused.seed), conformance.device
    for head in sizes:
        cache = rope_cache(head, device)
        for tokens, (hq, hk) in itertools.product(FUSED_TOKENS, ROTARY_HEADS):
            q = randn(gen, tokens, hq, head).to(device, fused.dtype)
            k = randn(gen, tokens, hk, head).to(device, fused.dtype)
            if fused.layout == "strided":
                q, k = qkv_views(q, k, gen)
            tensors = {"positions": positions(gen, tokens).to(device), "query": q, "key": k}
            check_call(
                f"rotary(q [{tokens}, {hq}, {head}], k [{tokens}, {hk}, {head}])",
                fused.dtype,
                ops.rotary,
                REFERENCE.rotary,
                tensors,
                [(tokens, hq, head), (tokens, hk, head)],
                extra=(cache,),
            )
        assert_rope_cache_untouched(cache, head, f"rotary (head size {head})")


@pytest.mark.paged_capability("fused:rotate_heads")
@pytest.mark.paged_cases("fused")
def test_rotate_heads(conformance: Conformance, fused: FusedCase) -> None:
    """Each head vector times ``R(D)`` (``paged_core.api.head_rotation``) at each declared head size, 1 and 9 heads;
    rotating the result again gives the input back (``R`` is its own inverse).

    ``-strided`` passes ``x`` as the key slice of a merged QKV projection output and as a head-major tensor.
    """
    sizes = rotation_head_sizes(conformance.caps)
    if not sizes:
        pytest.skip("N/A: no head size declared")
    ops, gen, device = conformance.fused_ops(), generator(fused.seed), conformance.device
    for head, tokens, heads in itertools.product(sizes, FUSED_TOKENS, ROTATION_HEADS):
        x = randn(gen, tokens, heads, head, scale=2.0).to(device, fused.dtype)
        views = {"": x}
        if fused.layout == "strided":
            _, key = qkv_views(randn(gen, tokens, heads, head).to(device, fused.dtype), x, gen)
            views = {" (a QKV slice)": key, " (head-major)": head_major_view(x)}
        for how, view in views.items():
            what = f"rotate_heads(x [{tokens}, {heads}, {head}]){how}"
            ((out, _),) = check_call(
                what, fused.dtype, ops.rotate_heads, REFERENCE.rotate_heads, {"x": view}, [(tokens, heads, head)]
            )
            assert_close(ops.rotate_heads(out), x, fused.dtype, f"{what} rotated again (R is its own inverse)")


def _linear_case(
    ops: FusedOps, fused: FusedCase, gen: torch.Generator, device: torch.device, n: int, k: int, bias: bool
) -> None:
    """Pack one weight, call ``linear`` at every M and at the first M again, then re-check every earlier output."""
    weight = linear_weight(gen, n, k).to(device, fused.dtype)
    b = randn(gen, n).to(device, fused.dtype) if bias else None
    ref_packed = REFERENCE.pack_linear(weight.clone(), None if b is None else b.clone())
    if fused.layout == "strided":
        weight, b = transposed_view(weight), None if b is None else spaced_view(b)
    label = f"weight [{n}, {k}]" + (", bias" if bias else "")
    guard = Untouched({"weight": weight, "bias": b})
    packed = ops.pack_linear(weight, b)
    guard.check(f"pack_linear({label})")
    if not isinstance(packed, PackedLinear):
        raise AssertionError(f"pack_linear({label}) returned {type(packed).__name__}, not a PackedLinear")
    if (packed.out_features, packed.in_features) != (n, k):
        raise AssertionError(
            f"pack_linear({label}) gave out/in features ({packed.out_features}, "
            f"{packed.in_features}), expected ({n}, {k})"
        )
    done: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    ms = [*LINEAR_TOKENS, LINEAR_TOKENS[0]]  # the first M again, on other values: earlier outputs must not change
    for i, m in enumerate(ms):
        x = randn(gen, m, k).to(device, fused.dtype)
        what = f"linear(x [{m}, {k}], {label})" + (" called again" if i == len(LINEAR_TOKENS) else "")
        xv = column_view(x) if fused.layout == "strided" else x
        ((out, want),) = check_call(
            what,
            fused.dtype,
            ops.linear,
            REFERENCE.linear,
            {"x": xv},
            [(m, n)],
            extra=(packed,),
            oracle_extra=(ref_packed,),
        )
        done.append((what, out, want))
    for what, out, want in done:  # an output buffer the backend reuses would have changed since
        assert_close(out, want, fused.dtype, f"{what}, read back after later calls")
    guard.check(f"linear({label})")


@pytest.mark.paged_capability("fused:linear")
@pytest.mark.paged_cases("fused")
def test_linear(conformance: Conformance, fused: FusedCase) -> None:
    """``pack_linear`` once per weight (with and without bias), then ``linear`` at M = 1, 3, 16, 64, 300 and again.

    Earlier outputs are compared again after the later calls (an output
    buffer reused across calls fails), and the weight and bias must be
    untouched by packing and by every call.
    """
    ops, gen = conformance.fused_ops(), generator(fused.seed)
    for (n, k), bias in itertools.product(LINEAR_SHAPES, (False, True)):
        _linear_case(ops, fused, gen, conformance.device, n, k, bias)


TRACE_TOKENS = 7
TRACE_EPS = 1e-6


def _trace_step(
    op: str, ops: FusedOps, fused: FusedCase, gen: torch.Generator, conformance: Conformance
) -> tuple[Callable[..., object], tuple[torch.Tensor, ...], int]:
    """A function calling one op, its (strided) tensor arguments, and how many tensors it returns."""
    device, dtype, t = conformance.device, fused.dtype, TRACE_TOKENS
    if op in ("rms_norm", "add_rms_norm"):
        tensors = _norm_inputs(fused, gen, device, t, NORM_HIDDEN[2], residual=op == "add_rms_norm")
        if op == "rms_norm":
            return (lambda x, w: ops.rms_norm(x, w, TRACE_EPS)), tuple(tensors.values()), 1
        return (lambda x, r, w: ops.add_rms_norm(x, r, w, TRACE_EPS)), tuple(tensors.values()), 2
    if op == "silu_and_mul":
        x = column_view(randn(gen, t, 2 * SILU_INTERMEDIATE[1]).to(device, dtype))
        return ops.silu_and_mul, (x,), 1
    if op == "rotary":
        sizes = rotary_head_sizes(conformance.caps)
        if not sizes:
            pytest.skip("N/A: no even head size declared")
        hq, hk = ROTARY_HEADS[1]
        q, k = qkv_views(
            randn(gen, t, hq, sizes[0]).to(device, dtype), randn(gen, t, hk, sizes[0]).to(device, dtype), gen
        )
        return ops.rotary, (positions(gen, t).to(device), q, k, rope_cache(sizes[0], device)), 2
    if op == "rotate_heads":
        sizes = rotation_head_sizes(conformance.caps)
        if not sizes:
            pytest.skip("N/A: no head size declared")
        heads = ROTATION_HEADS[-1]
        _, key = qkv_views(
            randn(gen, t, heads, sizes[0]).to(device, dtype), randn(gen, t, heads, sizes[0]).to(device, dtype), gen
        )
        return ops.rotate_heads, (key,), 1
    n, k_in = LINEAR_SHAPES[2]
    packed = ops.pack_linear(
        transposed_view(linear_weight(gen, n, k_in).to(device, dtype)), spaced_view(randn(gen, n).to(device, dtype))
    )
    x = column_view(randn(gen, t, k_in).to(device, dtype))
    return (lambda x: ops.linear(x, packed)), (x,), 1


@pytest.mark.paged_capability("fused:trace")
@pytest.mark.paged_cases("fused_trace")
@pytest.mark.parametrize("op", FUSED_OPS)
def test_fused_op_traces(conformance: Conformance, fused: FusedCase, op: str) -> None:
    """The op compiles as one graph (``fullgraph=True``, ``aot_eager``) on strided inputs, reads nothing on the host,
    and the compiled call returns what the eager one does."""
    ops = conformance.fused_ops()
    fn, args, count = _trace_step(op, ops, fused, generator(fused.seed), conformance)
    with HostReads() as reads:
        eager = as_tuple(fn(*args), op, count)
    if reads.seen:
        raise AssertionError(
            f"fused op {op} reads tensors on the host ({', '.join(dict.fromkeys(reads.seen))}): a "
            "device graph would freeze the values seen at capture time"
        )
    try:
        compiled = torch.compile(own_entry(fn), backend="aot_eager", fullgraph=True, dynamic=False)(*args)
    except Exception as exc:
        raise AssertionError(
            f"fused op {op} does not trace as one graph (torch.compile fullgraph=True, aot_eager): {first_line(exc)}. "
            "An override must be a torch custom op with a fake (meta) implementation and read nothing on the host."
        ) from None
    for i, (got, want) in enumerate(zip(as_tuple(compiled, f"compiled {op}", count), eager, strict=True)):
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise AssertionError(
                f"compiled {op} output {i}: {tuple(got.shape)} {got.dtype}, eager gave "
                f"{tuple(want.shape)} {want.dtype} (does the fake implementation agree?)"
            )
        assert_close(got, want, fused.dtype, f"compiled {op} output {i} vs eager")
