"""The packed-weight linear (``paged_cpu.quant_linear``, ``CpuFusedOps.linear`` on a QuantizedWeight) against
``paged_core.quant.reference_linear`` and float64 sums of the exactly dequantized weight.

Tolerance (stated once, used everywhere): the kernels dequantize exactly and sum fp32 products in an order
of their own, so against the float64 sum ``exact`` of the same products

* fp32 output: ``|got - exact| <= RTOL_SUM * sum_k |x_k w_k|`` (+ the bias' magnitude), ``RTOL_SUM = 1e-5``;
* bf16 / fp16 output: the same plus one unit in the last place of the output dtype at ``|exact|`` (the one
  rounding of the fp32 sum), and fp16's subnormal spacing.

A single wrong weight moves an output by about ``1 / K`` of that sum (``>= 1e-3`` at the sizes here), a
hundred times the tolerance; ``test_a_corrupted_byte_is_caught`` checks that the check fails then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from paged_backend_cpu import CpuFusedOps, fused, ops
from paged_core.api import LINEAR_FORMATS as FORMATS
from paged_core.api import FusedOps, PackedLinear, QuantizedWeight
from paged_core.testing import dequantize, quantize_blocks, random_packed, reference_linear, round_activations_q8

REF = FusedOps()
RTOL_SUM = 1e-5
DECLARED = sorted(CpuFusedOps.linear_formats)
KERNEL_FORMATS = ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "int8"]
"""Formats the op has kernels for (the declared ones among them)."""
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VARIANTS = [v for v in ("avx512", "avx2", "scalar") if v == "scalar" or v in ops.supported_isas()]
"""The packed-weight kernel builds this CPU runs (16 lanes, 8 lanes, portable), each forced by set_quant_isa."""
ROWS = [1, 2, 3, 5, 8, 16, 17, 33, 64, 300, 512]
STREAM_ALL, DEQUANT_ALL = 1 << 30, 0
"""``stream_rows`` that send every row count to the streaming path, or to the dequantize path."""


@pytest.fixture(autouse=True)
def exact_activations() -> Iterator[None]:
    """These tests hold the fp32-activation path to the exact oracle; the int8 path's (test_q8_*) ask for
    ``int8_activations``, which runs after this and wins."""
    before = ops.linear_activations()
    ops.set_linear_activations("fp32")
    yield
    ops.set_linear_activations(before)


def build_fixture(builds: list[str], in_use: Callable[[], str], expected: Callable[[str], str]) -> Any:
    """A fixture over ``builds`` (set_quant_isa names), each forced in turn; ``in_use()`` must then give
    ``expected(build)``."""

    @pytest.fixture(params=builds)
    def fixture(request: pytest.FixtureRequest, use_isa: Callable[[str], str]) -> Iterator[str]:
        name: str = request.param
        use_isa(name if name != "avx512" else "auto")
        ops.set_quant_isa(name)
        assert in_use() == expected(name)
        yield name
        ops.set_quant_isa("auto")

    return fixture


variant = build_fixture(VARIANTS, ops.quant_isa, lambda name: name)


@pytest.fixture
def threads() -> Iterator[Callable[[int], None]]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def in_features_for(fmt: str, k: int) -> int:
    """``k`` rounded up to the format's block (q4_k and q6_k: 256)."""
    block = FORMATS[fmt].block_size
    return -(-k // block) * block


def make_weight(fmt: str, n: int, k: int, seed: int) -> QuantizedWeight:
    return random_packed(FORMATS[fmt], n, k, torch.Generator().manual_seed(seed))


def rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def strided_rows(t: torch.Tensor, pad: int = 13) -> torch.Tensor:
    """The same values with a row stride that is not the width (a slice of a wider tensor)."""
    wide = torch.full((t.shape[0], t.shape[1] + pad), float("nan"), dtype=t.dtype)
    wide[:, 5 : 5 + t.shape[1]] = t
    return wide[:, 5 : 5 + t.shape[1]]


def tolerance(x: torch.Tensor, wd: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, tol)``: float64 sums of the fp32 products and the stated bound around them."""
    xd = x.double()
    exact = xd @ wd.t()
    mag = xd.abs() @ wd.abs().t()
    if bias is not None:
        exact = exact + bias.double()
        mag = mag + bias.double().abs()
    tol = RTOL_SUM * mag + 1e-30
    if x.dtype != torch.float32:
        tol = tol + torch.finfo(x.dtype).eps * exact.abs()
        if x.dtype == torch.float16:
            tol = tol + 2.0**-24
    return exact, tol


def check(
    got: torch.Tensor,
    x: torch.Tensor,
    wd: torch.Tensor,
    bias: torch.Tensor | None,
    bound: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """``got`` within the stated tolerance of the float64 sums (``bound``: :func:`tolerance`'s, if computed)."""
    assert got.dtype == x.dtype and got.shape == (x.shape[0], wd.shape[0]) and got.is_contiguous()
    exact, tol = bound if bound is not None else tolerance(x, wd, bias)
    err = (got.double() - exact).abs()
    bad = err > tol
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.numel()} outside the tolerance, worst excess {(err / tol).max():.3g}x"
    )


def shapes_for(fmt: str, rows: int) -> list[tuple[int, int]]:
    """(N, K): the embedded model's k/v projection and an odd N; small ones for the big batches."""
    if rows >= 300:
        return [(37, in_features_for(fmt, 64))]
    if fmt == "int8":
        return [(192, 576), (37, 100)]  # K = 100: runs of 32 and a tail of 4
    return [(192, in_features_for(fmt, 576)), (37, in_features_for(fmt, 64))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_quant_linear_matches_the_reference(variant: str, fmt: str, dtype: torch.dtype) -> None:
    """Every row count through both paths (streaming and dequantize), with and without bias, strided x."""
    weights: dict[tuple[int, int], tuple[QuantizedWeight, torch.Tensor]] = {}
    fid = ops.QUANT_FORMATS[fmt]
    for i, rows in enumerate(ROWS):
        for n, k in shapes_for(fmt, rows):
            if (n, k) not in weights:
                w = make_weight(fmt, n, k, seed=n + k)
                weights[(n, k)] = (w, dequantize(w).double())
            w, wd = weights[(n, k)]
            x = rand(rows, k, dtype=dtype, seed=rows)
            bias = rand(n, dtype=dtype if i % 2 else torch.float32, seed=n) * 0.1 if i % 3 != 0 else None
            bound = tolerance(x, wd, bias)
            results = []
            for stream_rows in (STREAM_ALL, DEQUANT_ALL):
                got = ops.quant_linear(x, w.data, w.scale, bias, fid, n, stream_rows)
                check(got, x, wd, bias, bound)
                results.append(got)
            if rows <= 17:  # a row stride that is not K, on both paths
                for stream_rows, want in zip((STREAM_ALL, DEQUANT_ALL), results, strict=True):
                    got = ops.quant_linear(strided_rows(x), w.data, w.scale, bias, fid, n, stream_rows)
                    assert torch.equal(got, want)
            if rows in (3, 300):
                check(reference_linear(x, w, bias), x, wd, bias, bound)  # the oracle meets the same bound


@pytest.mark.parametrize("fmt", DECLARED)
def test_fused_ops_linear_on_a_packed_weight(fmt: str) -> None:
    """CpuFusedOps packs a declared format without copying, and its linear is the kernel (both sides of
    the row threshold), against reference_linear."""
    cpu = CpuFusedOps()
    n, k = 100, in_features_for(fmt, 96)
    w = make_weight(fmt, n, k, seed=3)
    bias = rand(n, dtype=torch.float32, seed=4)
    packed = cpu.pack_linear(w, bias)
    assert isinstance(packed.packed, fused.CpuQuantWeight)
    assert packed.weight is w and packed.bias is bias
    assert packed.packed.data is w.data and packed.packed.scale is w.scale  # the weight's bytes, not a copy
    wd = dequantize(w).double()
    stream_rows = cpu.quant_stream_rows[fmt]
    assert packed.packed.stream_rows == stream_rows
    for rows in (1, stream_rows, stream_rows + 1, 40):
        for dtype in DTYPES:
            x = rand(rows, k, dtype=dtype, seed=rows)
            got = cpu.linear(x, packed)
            check(got, x, wd, bias)
            want = REF.linear(x, REF.pack_linear(w, bias))
            assert torch.equal(want, reference_linear(x, w, bias))
            if dtype != torch.float32:  # both round fp32 sums that differ in the last bits: mostly identical
                assert (got == want).double().mean() >= 0.9


def test_quantized_from_a_dense_weight() -> None:
    """Blocks written by quantize_blocks (ggml's rounding) from a real-valued weight, not random bytes."""
    cpu = CpuFusedOps()
    dense = rand(96, 576, dtype=torch.float32, seed=1) * 0.05
    x = rand(5, 576, dtype=torch.float32, seed=2)
    for fmt in ("q4_0", "q4_1", "q8_0"):
        w = quantize_blocks(dense, FORMATS[fmt])
        check(cpu.linear(x, cpu.pack_linear(w)), x, dequantize(w).double(), None)
        # and close to the dense product: the quantization's own error (a loose check of the formats)
        want = x @ dense.t()
        rel = (cpu.linear(x, cpu.pack_linear(w)) - want).norm() / want.norm()
        assert rel < (0.02 if fmt == "q8_0" else 0.2), rel


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_a_corrupted_byte_is_caught(fmt: str) -> None:
    """Changing one packed byte (a quant or a scale) changes the output beyond the tolerance, on both paths."""
    n, k = 24, in_features_for(fmt, 64)
    w = make_weight(fmt, n, k, seed=5)
    x = rand(3, k, dtype=torch.float32, seed=6).abs() + 0.5  # no cancellation: the change cannot hide
    wd = dequantize(w).double()
    info = FORMATS[fmt]
    # A quant byte in row 7: the first data byte after the block's header (q6_k: a low-nibble byte).
    offset = {"q4_0": 2, "q4_1": 4, "q8_0": 2, "q4_k": 16, "q6_k": 0, "int8": 0}[fmt]
    scale_offset = {"q4_0": 1, "q4_1": 1, "q8_0": 1, "q4_k": 1, "q6_k": 209, "int8": None}[fmt]
    for pos in (offset, scale_offset):
        if pos is None:
            continue
        data = w.data.clone()
        flat = data.view(torch.uint8)
        flat[7, pos] ^= 0x44 if pos == offset else 0x04  # two nibble bits / an exponent bit of the fp16 scale
        bad = QuantizedWeight(info, w.shape, data, w.scale)
        assert not torch.equal(dequantize(bad), dequantize(w))
        for stream_rows in (STREAM_ALL, DEQUANT_ALL):
            got = ops.quant_linear(x, bad.data, bad.scale, None, ops.QUANT_FORMATS[fmt], n, stream_rows)
            check(got, x, dequantize(bad).double(), None)  # the kernel reads the corrupted byte ...
            with pytest.raises(AssertionError, match="outside the tolerance"):
                check(got, x, wd, None)  # ... and the check against the original weight fails
            assert torch.equal(
                got[:, :7], ops.quant_linear(x, w.data, w.scale, None, ops.QUANT_FORMATS[fmt], n, stream_rows)[:, :7]
            )


def test_int8_scale_is_read_per_row() -> None:
    w = make_weight("int8", 20, 40, seed=1)
    x = rand(2, 40, dtype=torch.float32, seed=2)
    s = w.scale.clone()
    s[11] *= 2
    got = ops.quant_linear(x, w.data, s, None, ops.QUANT_FORMATS["int8"], 20, STREAM_ALL)
    base = ops.quant_linear(x, w.data, w.scale, None, ops.QUANT_FORMATS["int8"], 20, STREAM_ALL)
    torch.testing.assert_close(got[:, 11], 2 * base[:, 11], rtol=1e-6, atol=0)
    assert torch.equal(got[:, :11], base[:, :11]) and torch.equal(got[:, 12:], base[:, 12:])


def test_weight_views_and_column_strided_x(variant: str) -> None:
    """Rows of a merged weight (a view with a row offset), and an x whose columns are strided."""
    merged = QuantizedWeight.cat([make_weight("q4_1", 40, 64, seed=1), make_weight("q4_1", 24, 64, seed=2)])
    part = merged.rows(40, 64)
    assert part.data.data_ptr() != merged.data.data_ptr()
    x = rand(64, 7, dtype=torch.bfloat16, seed=3).t()  # [7, 64], column stride 7
    for stream_rows in (STREAM_ALL, DEQUANT_ALL):
        got = ops.quant_linear(x, part.data, None, None, ops.QUANT_FORMATS["q4_1"], 24, stream_rows)
        check(got, x, dequantize(part).double(), None)
    # a weight whose rows are further apart than their bytes (every other row of a bigger one)
    big = make_weight("q8_0", 30, 64, seed=4)
    every_other = QuantizedWeight(big.format, (15, 64), big.data[::2], None)
    got = ops.quant_linear(x, every_other.data, None, None, ops.QUANT_FORMATS["q8_0"], 15, STREAM_ALL)
    check(got, x, dequantize(every_other).double(), None)


def test_results_do_not_depend_on_threads(threads: Callable[[int], None]) -> None:
    """Each output is one tile's sum, whatever the split over threads: identical bits on 1 and 2 threads."""
    w = make_weight("q4_0", 1000, 576, seed=1)
    fid = ops.QUANT_FORMATS["q4_0"]
    results = []
    for t in (1, 2):
        threads(t)
        results.append(
            [
                ops.quant_linear(rand(m, 576, dtype=torch.float32, seed=m), w.data, None, None, fid, 1000, sr)
                for m in (1, 7, 40)
                for sr in (STREAM_ALL, DEQUANT_ALL)
            ]
        )
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_a_rows_result_does_not_depend_on_its_batch(variant: str, fmt: str) -> None:
    """Batch invariance with exact activations: each row of x gives identical bits alone, in any batch size,
    at any place in the batch, streamed or dequantized first (the e2e parity tests and in- against
    out-of-process equality rely on it: a request's batch-mates change with the schedule)."""
    n, k = 70, in_features_for(fmt, 100 if fmt == "int8" else 576)  # 70 = tiles of 8, 4 and 3 plus a rest
    w = make_weight(fmt, n, k, seed=5)
    fid = ops.QUANT_FORMATS[fmt]
    x = rand(13, k, dtype=torch.float32, seed=6)
    alone = torch.cat([ops.quant_linear(x[i : i + 1], w.data, w.scale, None, fid, n, STREAM_ALL) for i in range(13)])
    for m in range(2, 14):
        for stream_rows in (STREAM_ALL, DEQUANT_ALL):
            got = ops.quant_linear(x[:m], w.data, w.scale, None, fid, n, stream_rows)
            assert torch.equal(got, alone[:m]), f"{m} rows, stream_rows {stream_rows}"
    got = ops.quant_linear(x[1:8], w.data, w.scale, None, fid, n, STREAM_ALL)  # shifted: row 1 is first now
    assert torch.equal(got, alone[1:8])


def test_other_packs_go_to_the_reference() -> None:
    """A format not declared, a reference PackedLinear, or an x dtype without a kernel: the reference's result."""
    cpu = CpuFusedOps()

    class Narrow(CpuFusedOps):
        linear_formats = frozenset({"q8_0"})

    narrow = Narrow()
    w = make_weight("q4_0", 20, 64, seed=1)
    x = rand(3, 64, dtype=torch.float32, seed=2)
    ref_packed = REF.pack_linear(w)
    assert torch.equal(cpu.linear(x, ref_packed), REF.linear(x, ref_packed))
    assert torch.equal(cpu.linear(x.double(), cpu.pack_linear(w)), reference_linear(x.double(), w))
    for fmt in sorted(set(FORMATS) - {"q8_0"}):  # formats a backend does not declare: packed by the reference
        u = make_weight(fmt, 20, in_features_for(fmt, 64), seed=3)
        packed = narrow.pack_linear(u)
        assert packed.packed is None
        xu = rand(3, u.in_features, dtype=torch.float32, seed=4)
        assert torch.equal(narrow.linear(xu, packed), reference_linear(xu, u))
    # a dense weight without a packed copy still goes to torch's linear
    dense = rand(8, 16, dtype=torch.float32, seed=5)
    xd = rand(2, 16, dtype=torch.float32, seed=6)
    assert torch.equal(cpu.linear(xd, PackedLinear(dense)), torch.nn.functional.linear(xd, dense))


def test_declared_formats() -> None:
    assert CpuFusedOps.linear_formats == set(KERNEL_FORMATS) == set(FORMATS)
    assert set(ops.QUANT_FORMATS) == set(FORMATS)
    table = fused.QUANT_STREAM_MAX_ROWS.get(ops.supported_isas()[0], fused.QUANT_STREAM_DEFAULT)
    assert fused.default_quant_stream_rows() == table and set(table) == set(FORMATS)
    assert CpuFusedOps(quant_stream_rows={"q8_0": 0}).quant_stream_rows == {**table, "q8_0": 0}


def test_inputs_are_never_modified() -> None:
    for fmt in ("q4_k", "int8"):
        w = make_weight(fmt, 30, 256, seed=1)
        x = rand(9, 256, dtype=torch.bfloat16, seed=2)
        b = rand(30, dtype=torch.bfloat16, seed=3)
        saved = [t.clone() for t in (x, w.data, w.scale, b) if t is not None]
        for sr in (STREAM_ALL, DEQUANT_ALL):
            out = ops.quant_linear(x, w.data, w.scale, b, ops.QUANT_FORMATS[fmt], 30, sr)
            for t, s in zip([t for t in (x, w.data, w.scale, b) if t is not None], saved, strict=True):
                assert torch.equal(t, s)
                assert out.data_ptr() != t.data_ptr()


@pytest.mark.parametrize("dynamic", [False, True])
def test_traces_as_one_graph(dynamic: bool) -> None:
    """torch.compile(fullgraph=True) through CpuFusedOps.linear on packed weights (the op's fake impl)."""
    torch._dynamo.reset()
    cpu = CpuFusedOps()
    up = cpu.pack_linear(make_weight("q8_0", 48, 32, seed=1), rand(48, dtype=torch.float32, seed=2))
    down = cpu.pack_linear(make_weight("int8", 32, 24, seed=3))

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return cpu.linear(cpu.silu_and_mul(cpu.linear(x, up)), down)

    compiled = torch.compile(mlp, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for t in (1, 3, 20):
        x = rand(t, 32, dtype=torch.bfloat16, seed=t)
        assert torch.equal(compiled(x), mlp(x))


@pytest.mark.parametrize(
    "fmt,dtype,bias", [("q4_0", torch.float32, True), ("int8", torch.bfloat16, False), ("q6_k", torch.float16, True)]
)
def test_opcheck(fmt: str, dtype: torch.dtype, bias: bool) -> None:
    k = in_features_for(fmt, 64)
    w = make_weight(fmt, 20, k, seed=1)
    b = rand(20, dtype=dtype, seed=2) if bias else None
    for stream_rows in (STREAM_ALL, DEQUANT_ALL):
        args = (rand(3, k, dtype=dtype, seed=3), w.data, w.scale, b, ops.QUANT_FORMATS[fmt], 20, stream_rows)
        torch.library.opcheck(torch.ops.paged_cpu.quant_linear.default, args)


Q4 = make_weight("q4_0", 20, 64, seed=1)
I8 = make_weight("int8", 20, 64, seed=2)
XQ = torch.randn(3, 64)
F_Q4, F_I8 = ops.QUANT_FORMATS["q4_0"], ops.QUANT_FORMATS["int8"]


def _bad(*args: object) -> Callable[[], object]:
    return lambda: ops.quant_linear(*args)  # type: ignore[arg-type]


BAD_CALLS: list[tuple[Callable[[], object], str]] = [
    (_bad(XQ, Q4.data, None, None, 9, 20, 8), r"quant_linear: fmt 9 is not a format id \(0 q4_0"),
    (_bad(XQ, Q4.data, None, None, -1, 20, 8), r"fmt -1 is not a format id"),
    (_bad(XQ[0], Q4.data, None, None, F_Q4, 20, 8), r"quant_linear: x must be 2-D"),
    (_bad(XQ.double(), Q4.data, None, None, F_Q4, 20, 8), r"quant_linear: x dtype Double not supported"),
    (
        _bad(torch.randn(3, 48), Q4.data, None, None, F_Q4, 20, 8),
        r"x has 48 features, not a positive multiple of the q4_0 block of 32",
    ),
    (_bad(torch.randn(3, 96), Q4.data, None, None, F_Q4, 20, 8), r"data must be \[20, 54\] \(out_features, 3 blocks"),
    (_bad(XQ, Q4.data, None, None, F_Q4, 21, 8), r"data must be \[21, 36\]"),
    (_bad(XQ, Q4.data.view(torch.int8), None, None, F_Q4, 20, 8), r"data must be a cpu Byte tensor for q4_0, got Char"),
    (_bad(XQ, I8.data.view(torch.uint8), I8.scale, None, F_I8, 20, 8), r"data must be a cpu Char tensor for int8"),
    (_bad(XQ, Q4.data, None, None, F_Q4, 0, 8), r"out_features must be positive, got 0"),
    (_bad(XQ, I8.data, None, None, F_I8, 20, 8), r"int8 needs scale, an fp32 \[20\] tensor"),
    (_bad(XQ, I8.data, I8.scale.double(), None, F_I8, 20, 8), r"scale must be a cpu float32 \[20\] tensor, got Double"),
    (_bad(XQ, I8.data, I8.scale[:19], None, F_I8, 20, 8), r"float32 \[20\] tensor, got Float of shape \[19\]"),
    (_bad(XQ, Q4.data, I8.scale, None, F_Q4, 20, 8), r"scale must be None for q4_0"),
    (_bad(XQ, Q4.data, None, torch.randn(19), F_Q4, 20, 8), r"quant_linear: bias must be \[20\], got shape \[19\]"),
    (_bad(XQ, Q4.data, None, torch.randn(20).double(), F_Q4, 20, 8), r"quant_linear: bias dtype Double not supported"),
    (_bad(XQ, Q4.data.t().contiguous().t(), None, None, F_Q4, 20, 8), r"data rows must be contiguous, got strides"),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS, ids=[str(i) for i in range(len(BAD_CALLS))])
def test_bad_input_is_refused_with_a_message_naming_it(call: Callable[[], object], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()


def test_packed_weight_kernels_follow_the_layer_kernels_unless_forced(use_isa: Callable[[str], str]) -> None:
    use_isa("scalar")
    assert ops.quant_isa() == "scalar"
    use_isa("auto")
    assert ops.quant_isa() == ops.fused_isa()  # never the 16-lane build by default
    with pytest.raises(RuntimeError, match=r"packed-weight kernels 'neon' are not available here \(available: auto, "):
        ops.set_quant_isa("neon")
    assert ops.quant_isa() == ops.fused_isa()


# ---- the int8-activation path (q4_0, q4_1 at streaming row counts) ----
#
# Oracle: the exact product of the dequantized weight with round_activations_q8(x) (each 32-wide block of each
# row rounded to int8 times an fp32 scale), in float64, with the tolerance above over the rounded activations.
# A wrong nibble, scale or min, or an activation rounded differently, moves an output far beyond it
# (test_q8_a_corrupted_byte_is_caught; test_q8_activations_are_rounded_bit_for_bit for the rounding itself).

Q8_FORMATS = ["q4_0", "q4_1"]
BUILDS = {"avx512": "vnni", "avx2": "avx2", "scalar": "scalar"}
"""set_quant_isa's build -> the q8 kernels it runs (avx512 and auto: AVX-512 VNNI where the CPU has it)."""
HAS_VNNI = "avx512" in ops.supported_isas() and ops.quant_q8_isa() == "vnni"
Q8_VARIANTS = [
    b
    for b in BUILDS
    if b == "scalar" or (b == "avx2" and "avx2" in ops.supported_isas()) or (b == "avx512" and HAS_VNNI)
]


@pytest.fixture
def int8_activations() -> Iterator[None]:
    """The int8 path (requested after the module's exact_activations, so it wins)."""
    before = ops.linear_activations()
    assert ops.set_linear_activations("int8") == "int8"
    yield
    ops.set_linear_activations(before)


q8_variant = build_fixture(Q8_VARIANTS, ops.quant_q8_isa, BUILDS.__getitem__)


def check_q8(got: torch.Tensor, x: torch.Tensor, wd: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``got`` within the tolerance of the exact product over the rounded activations (in ``x.dtype``'s ulps)."""
    rounded = round_activations_q8(x).double()
    exact, tol = tolerance(rounded, wd, bias)
    if x.dtype != torch.float32:  # the output's rounding, as for x itself
        tol = tol + torch.finfo(x.dtype).eps * exact.abs() + (2.0**-24 if x.dtype == torch.float16 else 0.0)
    check(got, x, wd, bias, (exact, tol))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_q8_matches_the_rounded_oracle(int8_activations: None, q8_variant: str, fmt: str, dtype: torch.dtype) -> None:
    fid = ops.QUANT_FORMATS[fmt]
    for n, k in ((192, 576), (37, 64), (13, 1536)):
        w = make_weight(fmt, n, k, seed=n + k)
        wd = dequantize(w).double()
        for rows in (1, 2, 3, 4, 5, 8, 9):
            x = rand(rows, k, dtype=dtype, seed=rows)
            bias = rand(n, dtype=dtype, seed=n) * 0.1 if rows % 2 else None
            got = ops.quant_linear(x, w.data, None, bias, fid, n, STREAM_ALL)
            check_q8(got, x, wd, bias)
            assert torch.equal(ops.quant_linear(strided_rows(x), w.data, None, bias, fid, n, STREAM_ALL), got)


def test_q8_builds_agree(int8_activations: None, use_isa: Callable[[str], str]) -> None:
    """Integer dot products are exact, so every build sums the same per-block terms: results within fp32 noise."""
    w = make_weight("q4_1", 64, 576, seed=1)
    x = rand(3, 576, dtype=torch.float32, seed=2)
    outs = {}
    for name in Q8_VARIANTS:
        use_isa(name if name != "avx512" else "auto")
        ops.set_quant_isa(name)
        outs[name] = ops.quant_linear(x, w.data, None, None, ops.QUANT_FORMATS["q4_1"], 64, STREAM_ALL)
    ops.set_quant_isa("auto")
    for name, out in outs.items():
        torch.testing.assert_close(out, outs["scalar"], rtol=1e-5, atol=1e-5, msg=name)


def test_q8_activations_are_rounded_bit_for_bit(int8_activations: None, q8_variant: str) -> None:
    """A q4_1 weight (d = 1, m = 0) whose row j is 1 at column j: output column j is the rounded activation j."""
    k = 96
    data = torch.zeros(k, k // 32, 20, dtype=torch.uint8)
    data[:, :, 0:2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    for j in range(k):
        b, i = divmod(j, 32)
        data[j, b, 4 + i % 16] = 1 if i < 16 else 16  # weight i: low nibble of byte i, or high of byte i - 16
    w = QuantizedWeight(FORMATS["q4_1"], (k, k), data.reshape(k, -1))
    assert torch.equal(dequantize(w), torch.eye(k))
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(7)) * torch.logspace(-3, 3, k)
    x[1, :32] = 0.0  # a zero block: scale 0, every q 0
    got = ops.quant_linear(x, w.data, None, None, ops.QUANT_FORMATS["q4_1"], k, STREAM_ALL)
    want = round_activations_q8(x)
    assert torch.equal(got, want)
    assert not torch.equal(want, x)


@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_q8_a_corrupted_byte_is_caught(int8_activations: None, fmt: str) -> None:
    n, k = 24, 64
    w = make_weight(fmt, n, k, seed=5)
    x = rand(2, k, dtype=torch.float32, seed=6).abs() + 0.5
    wd = dequantize(w).double()
    for pos, flip in ((2 if fmt == "q4_0" else 4, 0x44), (1, 0x04), (3 if fmt == "q4_1" else None, 0x04)):
        if pos is None:
            continue
        data = w.data.clone()
        data[7, pos] ^= flip
        bad = QuantizedWeight(FORMATS[fmt], w.shape, data)
        got = ops.quant_linear(x, bad.data, None, None, ops.QUANT_FORMATS[fmt], n, STREAM_ALL)
        check_q8(got, x, dequantize(bad).double(), None)
        with pytest.raises(AssertionError, match="outside the tolerance"):
            check_q8(got, x, wd, None)


def test_q8_mode_switch_and_what_it_covers(int8_activations: None) -> None:
    """fp32 mode is the exact path again; int8 mode rounds at every row count (stream_rows does not apply to it);
    q8_0 and q4_k are always exact."""
    w = make_weight("q4_1", 40, 128, seed=1)
    x = rand(2, 128, dtype=torch.float32, seed=2)
    fid = ops.QUANT_FORMATS["q4_1"]
    rounded = ops.quant_linear(x, w.data, None, None, fid, 40, STREAM_ALL)
    assert ops.set_linear_activations("fp32") == "fp32" == ops.linear_activations()
    exact = ops.quant_linear(x, w.data, None, None, fid, 40, STREAM_ALL)
    check(exact, x, dequantize(w).double(), None)
    assert not torch.equal(rounded, exact)
    ops.set_linear_activations("int8")
    assert torch.equal(ops.quant_linear(x, w.data, None, None, fid, 40, 0), rounded)  # no exact dequantize path
    q8 = make_weight("q8_0", 40, 128, seed=5)  # 8-bit weights keep exact activations
    check(
        ops.quant_linear(x, q8.data, None, None, ops.QUANT_FORMATS["q8_0"], 40, STREAM_ALL),
        x,
        dequantize(q8).double(),
        None,
    )
    k4 = make_weight("q4_k", 40, 256, seed=3)
    xk = rand(2, 256, dtype=torch.float32, seed=4)
    check(
        ops.quant_linear(xk, k4.data, None, None, ops.QUANT_FORMATS["q4_k"], 40, STREAM_ALL),
        xk,
        dequantize(k4).double(),
        None,
    )
    with pytest.raises(RuntimeError, match="linear activations must be int8x2, int8 or fp32, got 'int4'"):
        ops.set_linear_activations("int4")
    assert ops.linear_activations() == "int8"


def test_q8_declared(int8_activations: None) -> None:
    assert CpuFusedOps.q8_activation_formats == set(Q8_FORMATS) <= CpuFusedOps.linear_formats


def test_q8_results_do_not_depend_on_threads(int8_activations: None, threads: Callable[[int], None]) -> None:
    w = make_weight("q4_0", 1000, 576, seed=1)
    outs = []
    for t in (1, 2):
        threads(t)
        outs.append(
            ops.quant_linear(
                rand(3, 576, dtype=torch.float32, seed=3),
                w.data,
                None,
                None,
                ops.QUANT_FORMATS["q4_0"],
                1000,
                STREAM_ALL,
            )
        )
    assert torch.equal(*outs)


# ---- the interleaved copy (groups of 8 rows) that decoding reads with int8 activations ----------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_interleaved_matches_the_rounded_oracle(
    int8_activations: None, q8_variant: str, fmt: str, dtype: torch.dtype
) -> None:
    """Same oracle as the row-major int8 path: every group count (one group, an odd count for the one-row tiles
    of two groups, many), every row tile, a bias, strided x; the scalar build has no such kernel and reads
    the rows as they are."""
    fid = ops.QUANT_FORMATS[fmt]
    for n, k in ((8, 32), (40, 64), (192, 576), (24, 1536)):
        w = make_weight(fmt, n, k, seed=n + k)
        wd = dequantize(w).double()
        interleaved = ops.interleave_q4(w.data, fid)
        assert interleaved.shape == (n // 8, w.data.shape[1] * 8) and interleaved.dtype == torch.uint8
        for rows in (1, 2, 3, 4, 5, 7):
            x = rand(rows, k, dtype=dtype, seed=rows)
            bias = rand(n, dtype=dtype, seed=n) * 0.1 if rows % 2 else None
            got = ops.quant_linear(x, w.data, None, bias, fid, n, STREAM_ALL, interleaved)
            check_q8(got, x, wd, bias)
            again = ops.quant_linear(strided_rows(x), w.data, None, bias, fid, n, STREAM_ALL, interleaved)
            assert torch.equal(again, got)


@pytest.mark.parametrize("fmt", Q8_FORMATS)
def test_interleaved_is_read_not_the_rows(int8_activations: None, fmt: str) -> None:
    """With the copy given, int8 activations read it at every row count: a byte changed there (and not in the
    rows) moves the result far out of tolerance, for 2 rows and for 64 (the AMX tiles where the CPU has them);
    exact activations read the rows themselves."""
    fid = ops.QUANT_FORMATS[fmt]
    w = make_weight(fmt, 64, 576, seed=2)
    wd = dequantize(w).double()
    interleaved = ops.interleave_q4(w.data, fid)
    interleaved[3, 40] ^= 0x77  # group 3, block 0: nibbles of rows 24-31
    if ops.quant_q8_isa() != "scalar":
        for rows in (2, 64):
            x = rand(rows, 576, dtype=torch.float32, seed=3)
            for stream_rows in (STREAM_ALL, DEQUANT_ALL):
                with pytest.raises(AssertionError, match="outside the tolerance"):
                    check_q8(ops.quant_linear(x, w.data, None, None, fid, 64, stream_rows, interleaved), x, wd, None)
    ops.set_linear_activations("fp32")
    x = rand(2, 576, dtype=torch.float32, seed=3)
    check(ops.quant_linear(x, w.data, None, None, fid, 64, STREAM_ALL, interleaved), x, wd, None)
    check(ops.quant_linear(x, w.data, None, None, fid, 64, DEQUANT_ALL, interleaved), x, wd, None)


def test_interleave_refuses_what_it_cannot_lay_out() -> None:
    w = make_weight("q4_1", 12, 64, seed=1)
    with pytest.raises(ValueError, match="groups of 8 rows"):
        ops.interleave_q4(w.data, ops.QUANT_FORMATS["q4_1"])
    with pytest.raises(ValueError, match="not q4_0 or q4_1"):
        ops.interleave_q4(make_weight("q8_0", 8, 64, seed=1).data, ops.QUANT_FORMATS["q8_0"])
    good = make_weight("q4_1", 16, 64, seed=1)
    interleaved = ops.interleave_q4(good.data, ops.QUANT_FORMATS["q4_1"])
    with pytest.raises(RuntimeError, match="interleaved must be"):
        ops.quant_linear(
            rand(1, 64, dtype=torch.float32, seed=1),
            good.data,
            None,
            None,
            ops.QUANT_FORMATS["q4_1"],
            16,
            STREAM_ALL,
            interleaved[:1],
        )
    with pytest.raises(RuntimeError, match="only read for q4_0 and q4_1"):
        q8 = make_weight("q8_0", 16, 64, seed=1)
        ops.quant_linear(
            rand(1, 64, dtype=torch.float32, seed=1),
            q8.data,
            None,
            None,
            ops.QUANT_FORMATS["q8_0"],
            16,
            STREAM_ALL,
            interleaved,
        )


def test_pack_linear_interleaves_q4_rows_in_groups_of_8() -> None:
    ops_ = CpuFusedOps()
    for fmt, n, expected in (("q4_1", 64, True), ("q4_0", 64, True), ("q4_1", 60, False), ("q8_0", 64, False)):
        packed = ops_.pack_linear(make_weight(fmt, n, 64, seed=1))
        assert isinstance(packed.packed, fused.CpuQuantWeight)
        assert (packed.packed.interleaved is not None) == expected, (fmt, n)
    assert CpuFusedOps(interleave=False).pack_linear(make_weight("q4_1", 64, 64, seed=1)).packed.interleaved is None


# ---- one rule at every row count (batch invariance) ---------------------------------------------------------


@pytest.mark.parametrize("fmt", Q8_FORMATS)
@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "rows"])
def test_int8_rows_are_batch_invariant(int8_activations: None, fmt: str, interleave: bool) -> None:
    """Every row's bits are the same alone, in any batch (1 to 80 rows: the 1-8 row tiles, the AMX 16-row tiles
    where the CPU has them, and their tails), shuffled, and whatever stream_rows says."""
    fid = ops.QUANT_FORMATS[fmt]
    w = make_weight(fmt, 72, 576, seed=4)
    copy = ops.interleave_q4(w.data, fid) if interleave else None
    x = rand(80, 576, dtype=torch.float32, seed=5)
    full = ops.quant_linear(x, w.data, None, None, fid, 72, STREAM_ALL, copy)
    for rows in (1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 33, 64):
        for stream_rows in (STREAM_ALL, DEQUANT_ALL):
            part = ops.quant_linear(x[:rows].clone(), w.data, None, None, fid, 72, stream_rows, copy)
            assert torch.equal(part, full[:rows]), (rows, stream_rows)
    perm = torch.randperm(80, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ops.quant_linear(x[perm], w.data, None, None, fid, 72, STREAM_ALL, copy), full[perm])
    one = torch.cat([ops.quant_linear(x[i : i + 1], w.data, None, None, fid, 72, STREAM_ALL, copy) for i in range(80)])
    assert torch.equal(one, full)
