"""CpuFusedOps against the pure-torch reference (FusedOps): every op, dtype, kernel variant, shape
and stride, tracing through the fake implementations, and bad input."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from paged_backend_cpu import CpuBackend, CpuFusedOps, fused, ops
from paged_core.api import FusedOps, PackedLinear

REF = FusedOps()
CPU = CpuFusedOps()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VARIANTS = [v for v in ("avx2", "scalar") if v == "scalar" or v in ops.supported_isas()]
"""Kernel variants of the layer ops this CPU runs (``set_isa`` of an AVX-512 variant also runs ``avx2``)."""
TOKENS = [1, 3, 64, 300]
EPS = 1e-6


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest, use_isa: Callable[[str], str]) -> str:
    """Runs the test once per layer-kernel variant; the attention ISA switch selects it."""
    name: str = request.param
    use_isa(name)
    assert ops.fused_isa() == name
    return name


def rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def strided_rows(t: torch.Tensor, pad: int = 13) -> torch.Tensor:
    """``t`` as a slice of a wider tensor: the same values with a row stride that is not its width."""
    wide = torch.full((t.shape[0], t.shape[1] + pad), float("nan"), dtype=t.dtype)
    start = pad // 2
    wide[:, start : start + t.shape[1]] = t
    view = wide[:, start : start + t.shape[1]]
    assert view.stride(0) != t.shape[1] or t.shape[0] == 1
    return view


def assert_matches(
    got: torch.Tensor,
    want: torch.Tensor,
    *,
    ulps: float = 1.0,
    exact_share: float = 0.97,
    atol: torch.Tensor | float = 0.0,
) -> None:
    """``got`` within ``ulps`` units in the last place of ``want`` (its dtype), and mostly identical.

    fp32 tolerates a few ulps of summation order (``ulps`` is scaled by 4); the 16-bit types,
    rounded once from fp32 sums that differ only in the last fp32 bits, at most one ulp, and
    at least ``exact_share`` of the elements must be bit-identical. ``atol`` adds an absolute
    allowance (per element), for sums that cancel.
    """
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.is_contiguous()
    eps = torch.finfo(want.dtype).eps
    g, w = got.double(), want.double()
    scale = 4.0 if want.dtype == torch.float32 else 1.0
    tol = ulps * scale * eps * w.abs() + atol + 1e-30
    if want.dtype == torch.float16:
        tol = tol + 2.0**-24  # fp16 subnormal spacing
    bad = (g - w).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} beyond {ulps} ulp, worst {(g - w).abs().max().item()}"
    if want.dtype != torch.float32:
        same = (got == want).double().mean().item()
        assert same >= exact_share, f"only {same:.3f} of the elements equal the reference"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", [576, 100, 7])
def test_rms_norm(variant: str, dtype: torch.dtype, tokens: int, hidden: int) -> None:
    x = rand(tokens, hidden, dtype=dtype, seed=tokens * hidden, scale=3.0)
    w = rand(hidden, dtype=dtype, seed=1)
    assert_matches(CPU.rms_norm(x, w, EPS), REF.rms_norm(x, w, EPS))
    assert_matches(CPU.rms_norm(strided_rows(x), w, EPS), REF.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", [576, 100])
def test_add_rms_norm(variant: str, dtype: torch.dtype, tokens: int, hidden: int) -> None:
    x = rand(tokens, hidden, dtype=dtype, seed=tokens + hidden)
    r = rand(tokens, hidden, dtype=dtype, seed=7, scale=4.0)
    w = rand(hidden, dtype=dtype, seed=2)
    want_norm, want_sum = REF.add_rms_norm(x, r, w, 1e-5)
    for xi, ri in ((x, r), (strided_rows(x), strided_rows(r, pad=3))):
        got_norm, got_sum = CPU.add_rms_norm(xi, ri, w, 1e-5)
        assert torch.equal(got_sum, want_sum), "x + residual must round exactly like the reference"
        assert_matches(got_norm, want_norm)


def test_rms_norm_weight_in_another_dtype(variant: str) -> None:
    """The reference reads ``weight.float()``, so an fp32 weight on bf16 rows is fine (and vice versa)."""
    x = rand(5, 96, dtype=torch.bfloat16, seed=3)
    for w in (rand(96, dtype=torch.float32, seed=4), rand(96, dtype=torch.float16, seed=4)):
        assert_matches(CPU.rms_norm(x, w, EPS), REF.rms_norm(x, w, EPS))
        assert_matches(CPU.add_rms_norm(x, x, w, EPS)[0], REF.add_rms_norm(x, x, w, EPS)[0])


def test_rms_norm_column_strided_input(variant: str) -> None:
    """Rows whose elements are not adjacent (a transposed view) are copied first, not misread."""
    x = rand(40, 24, dtype=torch.float32, seed=5).t()  # [24, 40], strides (1, 24)
    w = rand(40, dtype=torch.float32, seed=6)
    assert_matches(CPU.rms_norm(x, w, EPS), REF.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("inter", [1536, 50, 7])
def test_silu_and_mul(variant: str, dtype: torch.dtype, tokens: int, inter: int) -> None:
    x = rand(tokens, 2 * inter, dtype=dtype, seed=tokens * inter, scale=3.0)
    assert_matches(CPU.silu_and_mul(x), REF.silu_and_mul(x), ulps=1.0 if dtype != torch.float32 else 2.0)
    assert_matches(CPU.silu_and_mul(strided_rows(x)), REF.silu_and_mul(x), ulps=1.0 if dtype != torch.float32 else 2.0)


def test_silu_and_mul_extremes(variant: str) -> None:
    """Large gates (exp over- and underflow), zeros and infinities behave like torch's silu."""
    gate = torch.tensor(
        [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            20.0,
            -20.0,
            87.0,
            -87.0,
            88.8,
            -88.8,
            103.0,
            -103.0,
            200.0,
            -200.0,
            1e30,
            -1e30,
            float("inf"),
            3.5,
            -3.5,
            0.5,
        ]
    )
    up = torch.linspace(-2.0, 3.0, gate.numel())
    x = torch.cat([gate, up])[None, :]
    got, want = CPU.silu_and_mul(x), REF.silu_and_mul(x)
    finite = want.isfinite()
    assert torch.equal(got.isfinite(), finite)
    assert_matches(got[finite], want[finite], ulps=2.0)


def cos_sin_cache(max_pos: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The Llama / NeoX table: row p is cos(p * f) for each frequency f, then sin(p * f)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize(("heads", "kv_heads", "head_size"), [(9, 3, 64), (4, 1, 128), (2, 2, 6)])
def test_rotary_on_merged_qkv_views(
    variant: str, dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, head_size: int
) -> None:
    """query and key as views into one merged QKV projection (token stride = the whole QKV row)."""
    qkv = rand(tokens, (heads + 2 * kv_heads) * head_size, dtype=dtype, seed=tokens + heads, scale=2.0)
    q = qkv[:, : heads * head_size].view(tokens, heads, head_size)
    k = qkv[:, heads * head_size : (heads + kv_heads) * head_size].view(tokens, kv_heads, head_size)
    gen = torch.Generator().manual_seed(tokens)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    before = qkv.clone()
    for cache_dtype in {torch.float32, dtype}:
        cache = cos_sin_cache(4096, head_size, cache_dtype)
        got_q, got_k = CPU.rotary(positions, q, k, cache)
        want_q, want_k = REF.rotary(positions, q, k, cache)
        # a cos - b sin cancels: allow one ulp of the inputs' magnitude, not of the result's
        assert_matches(got_q, want_q, ulps=1.0, exact_share=0.95)
        assert_matches(got_k, want_k, ulps=1.0, exact_share=0.95)
    assert torch.equal(qkv, before), "rotary modified its inputs"


def test_rotary_positions_int32_and_head_strided_key(variant: str) -> None:
    q = rand(5, 4, 64, dtype=torch.bfloat16, seed=11)
    k = rand(5, 2, 128, dtype=torch.bfloat16, seed=12)[:, :, :64]  # head stride 128, not 64
    cache = cos_sin_cache(100, 64, torch.float32)
    positions = torch.tensor([0, 99, 3, 3, 50], dtype=torch.int32)
    got = CPU.rotary(positions, q, k, cache)
    want = REF.rotary(positions, q, k, cache)
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w, exact_share=0.95)
    at_zero = CPU.rotary(torch.zeros(5, dtype=torch.int64), q, k, cache)
    assert torch.equal(at_zero[0], q), "position 0 (cos 1, sin 0) must leave the query as it was"


# ---- linear ----

LINEAR_SHAPES = [(960, 576), (100, 37), (17, 5), (16, 1), (1, 8)]
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 32, 33, 64]


def oracle_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """float64 sums of the same (rounded) inputs, rounded once to x's dtype."""
    out = x.double() @ w.double().t()
    if b is not None:
        out = out + b.double()
    return out.to(x.dtype)


def sum_error(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A bound on fp32 summation error per output (sqrt(K) rounding steps of the magnitudes summed)."""
    return (x.double().abs() @ w.double().abs().t()) * 2.0**-24 * math.sqrt(x.shape[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("out_features", "in_features"), LINEAR_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_kernel(variant: str, dtype: torch.dtype, out_features: int, in_features: int, bias: bool) -> None:
    """The native kernel at every row count (max_rows unlimited), against float64 and the reference."""
    cpu = CpuFusedOps({dtype: fused.UNLIMITED})
    w = rand(out_features, in_features, dtype=dtype, seed=out_features, scale=in_features**-0.5)
    b = rand(out_features, dtype=dtype, seed=9) if bias else None
    packed = cpu.pack_linear(w, b)
    assert isinstance(packed.packed, fused.CpuPackedWeight)
    assert packed.weight is w and packed.bias is b
    for rows in ROWS:
        x = rand(rows, in_features, dtype=dtype, seed=rows)
        got = cpu.linear(x, packed)
        want = REF.linear(x, REF.pack_linear(w, b))
        exact = oracle_linear(x, w, b)
        assert got.dtype == dtype and got.shape == (rows, out_features)
        if dtype == torch.float32:
            tol = 1e-6 * math.sqrt(in_features)
            torch.testing.assert_close(got, exact, rtol=tol, atol=tol)
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        else:
            err = sum_error(x, w)
            assert_matches(got, exact, exact_share=0.97, atol=err)
            assert_matches(got, want, ulps=2.0, exact_share=0.8, atol=2 * err)
        assert_matches(cpu.linear(strided_rows(x), packed), got, ulps=0.0)


def test_linear_column_strided_and_converted_inputs(variant: str) -> None:
    cpu = CpuFusedOps({torch.float32: 64, torch.bfloat16: 64})
    w = rand(48, 40, dtype=torch.float32, seed=1)
    packed = cpu.pack_linear(w)
    x = rand(40, 6, dtype=torch.float32, seed=2).t()  # [6, 40], column stride 6
    torch.testing.assert_close(cpu.linear(x, packed), oracle_linear(x, w, None), rtol=1e-5, atol=1e-5)
    # a bf16 weight packed from a non-contiguous view
    wide = rand(48, 80, dtype=torch.bfloat16, seed=3)
    wb = wide[:, ::2]
    xb = rand(3, 40, dtype=torch.bfloat16, seed=4)
    assert_matches(cpu.linear(xb, cpu.pack_linear(wb)), oracle_linear(xb, wb, None), atol=sum_error(xb, wb))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_switches_to_torch_above_max_rows(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """Up to max_rows the native op runs, above it torch's linear on the original weight (oneDNN off)."""
    calls: list[int] = []
    native = ops.linear

    def spy(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(int(x.shape[0]))
        return native(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ops, "linear", spy)
    cpu = CpuFusedOps({dtype: 8}, onednn=False)
    w = rand(64, 32, dtype=dtype, seed=1)
    b = rand(64, dtype=dtype, seed=2)
    packed = cpu.pack_linear(w, b)
    for rows in (1, 8, 9, 40):
        x = rand(rows, 32, dtype=dtype, seed=rows)
        got = cpu.linear(x, packed)
        want = torch.nn.functional.linear(x, w, b)
        if rows > 8:
            assert torch.equal(got, want)
        else:
            assert_matches(got, oracle_linear(x, w, b), exact_share=0.9, atol=sum_error(x, w))
    assert calls == [1, 8]


def test_linear_without_a_packed_copy_is_torchs() -> None:
    """A dtype with no kernel configured is not packed (no second copy), and so is a reference PackedLinear."""
    cpu = CpuFusedOps({torch.bfloat16: 16}, onednn=False)
    w = rand(32, 16, dtype=torch.float32, seed=1)
    packed = cpu.pack_linear(w)
    assert packed.packed is None
    x = rand(2, 16, dtype=torch.float32, seed=2)
    assert torch.equal(cpu.linear(x, packed), torch.nn.functional.linear(x, w))
    wb = w.bfloat16()
    assert torch.equal(cpu.linear(x.bfloat16(), PackedLinear(wb)), torch.nn.functional.linear(x.bfloat16(), wb))


def test_pack_linear_layout() -> None:
    """Panels of 16 features, zero past N; bf16 words hold features j and 8 + j (csrc/fused_api.h)."""
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    p = ops.pack_linear(w)
    assert p.shape == (2, 3, 16)
    assert torch.equal(p[0, 1], w[:16, 1])
    assert torch.equal(p[1, 2, :4], w[16:, 2]) and not p[1, :, 4:].any()
    pb = ops.pack_linear(w.bfloat16())
    assert torch.equal(pb[0, 0, 0::2], w[:8, 0].bfloat16()) and torch.equal(pb[0, 0, 1::2], w[8:16, 0].bfloat16())


def test_default_crossover_follows_the_cpu() -> None:
    best = ops.supported_isas()[0]
    assert fused.default_max_rows() == fused.KERNEL_MAX_ROWS.get(best, {})
    if best == "avx2":
        assert fused.default_max_rows()[torch.float32] == 16
        assert fused.default_max_rows()[torch.bfloat16] == fused.UNLIMITED


# ---- the backend hook, inputs left alone, tracing ----


def test_backend_returns_its_fused_ops() -> None:
    backend = CpuBackend("cpu")
    f = backend.fused_ops()
    assert isinstance(f, CpuFusedOps) and isinstance(f, FusedOps) and f.name == "cpu"
    assert backend.fused_ops() is f


def test_inputs_are_never_modified() -> None:
    x = rand(4, 64, dtype=torch.bfloat16, seed=1)
    r = rand(4, 64, dtype=torch.bfloat16, seed=2)
    w = rand(64, dtype=torch.bfloat16, seed=3)
    g = rand(4, 128, dtype=torch.bfloat16, seed=4)
    saved = [t.clone() for t in (x, r, w, g)]
    outs = [CPU.rms_norm(x, w, EPS), *CPU.add_rms_norm(x, r, w, EPS), CPU.silu_and_mul(g)]
    for t, s in zip((x, r, w, g), saved, strict=True):
        assert torch.equal(t, s)
    for o in outs:
        for t in (x, r, w, g):
            assert o.data_ptr() != t.data_ptr()


def _layer(f: FusedOps, qkv_w: PackedLinear, down: PackedLinear, cache: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A miniature decoder layer through every op (heads 2 x 8, hidden 32, intermediate 24)."""

    def layer(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h, res = f.add_rms_norm(x, residual, w, 1e-5)
        qkv = f.linear(h, qkv_w)
        t = qkv.shape[0]
        q, k = f.rotary(positions, qkv[:, :16].view(t, 2, 8), qkv[:, 16:32].view(t, 2, 8), cache)
        act = f.silu_and_mul(qkv[:, 32:80])
        out = f.linear(act, down) + q.reshape(t, 16).sum(-1, keepdim=True) + k.reshape(t, 16).mean(-1, keepdim=True)
        return f.rms_norm(out + res, w, 1e-5)

    return layer


@pytest.mark.parametrize("dynamic", [False, True])
def test_layer_traces_as_one_graph(dynamic: bool) -> None:
    """torch.compile(fullgraph=True, aot_eager) traces every op through its fake implementation."""
    torch._dynamo.reset()
    dtype = torch.bfloat16
    f = CpuFusedOps({dtype: fused.UNLIMITED})
    qkv_w = f.pack_linear(rand(80, 32, dtype=dtype, seed=1), rand(80, dtype=dtype, seed=2))
    down = f.pack_linear(rand(32, 24, dtype=dtype, seed=3))
    layer = _layer(f, qkv_w, down, cos_sin_cache(64, 8, torch.float32))
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    w = rand(32, dtype=dtype, seed=4)
    for t in (3, 5):
        args = (rand(t, 32, dtype=dtype, seed=t), rand(t, 32, dtype=dtype, seed=t + 1), w, torch.arange(t) * 7)
        assert torch.equal(compiled(*args), layer(*args))


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("rms_norm", (torch.randn(3, 20), torch.randn(20), 1e-6)),
        ("add_rms_norm", (torch.randn(3, 20), torch.randn(3, 20), torch.randn(20), 1e-6)),
        ("silu_and_mul", (torch.randn(3, 20).bfloat16(),)),
        ("rotary", (torch.tensor([0, 5]), torch.randn(2, 3, 8), torch.randn(2, 1, 8), torch.randn(10, 8))),
        ("pack_linear", (torch.randn(20, 8),)),
        ("linear", (torch.randn(3, 8), ops.pack_linear(torch.randn(20, 8)), torch.randn(20), 20)),
    ],
)
def test_opcheck(name: str, args: tuple[object, ...]) -> None:
    """torch's own check of each op: schema, fake implementation against the real one, AOT dispatch."""
    torch.library.opcheck(getattr(torch.ops.paged_cpu, name).default, args)


# ---- bad input ----


X, W = torch.randn(3, 8), torch.randn(8)
Q, K, CACHE, POS = torch.randn(2, 3, 8), torch.randn(2, 1, 8), torch.randn(10, 8), torch.tensor([0, 9])
PACKED = ops.pack_linear(torch.randn(20, 8))

BAD_CALLS: list[tuple[Callable[[], object], str]] = [
    (
        lambda: CPU.rms_norm(torch.randn(8), W, EPS),
        r"paged_cpu.rms_norm: x must be 2-D \[tokens, hidden\], got shape \[8\]",
    ),
    (lambda: CPU.rms_norm(torch.randn(2, 3, 8), W, EPS), r"x must be 2-D"),
    (lambda: CPU.rms_norm(X, torch.randn(9), EPS), r"weight must be \[8\] \(the hidden size of x\), got shape \[9\]"),
    (
        lambda: CPU.add_rms_norm(X, torch.randn(3, 9), W, EPS),
        r"residual shape \[3, 9\] does not match x shape \[3, 8\]",
    ),
    (lambda: CPU.add_rms_norm(X, X.bfloat16(), W, EPS), r"residual dtype BFloat16 does not match x dtype Float"),
    (
        lambda: CPU.rms_norm(X.double(), W, EPS),
        r"rms_norm: x dtype Double not supported \(supported: float32, bfloat16",
    ),
    (lambda: CPU.rms_norm(X, W.double(), EPS), r"rms_norm: weight dtype Double not supported"),
    (
        lambda: CPU.silu_and_mul(torch.randn(3, 7)),
        r"silu_and_mul: the last dimension of x \(gate then up\) must be even",
    ),
    (lambda: CPU.silu_and_mul(torch.randn(6)), r"silu_and_mul: x must be 2-D"),
    (lambda: CPU.rotary(POS, Q[0], K, CACHE), r"rotary: query and key must be 3-D \[tokens, heads, head_size\]"),
    (
        lambda: CPU.rotary(POS, Q, K[:1], CACHE),
        r"query \[2, 3, 8\] and key \[1, 1, 8\] must have one token per position",
    ),
    (
        lambda: CPU.rotary(POS, Q, torch.randn(2, 1, 6), CACHE),
        r"query and key need the same even head_size, got 8 and 6",
    ),
    (lambda: CPU.rotary(POS, torch.randn(2, 3, 7), torch.randn(2, 1, 7), CACHE), r"same even head_size, got 7"),
    (lambda: CPU.rotary(POS, Q, K, torch.randn(10, 4)), r"rotary: cos_sin_cache must be \[max_position, 8\]"),
    (
        lambda: CPU.rotary(torch.tensor([0, 10]), Q, K, CACHE),
        r"positions\[1\] = 10 is out of range for a cos_sin_cache of 10",
    ),
    (lambda: CPU.rotary(torch.tensor([-1, 0]), Q, K, CACHE), r"positions\[0\] = -1 is out of range"),
    (lambda: CPU.rotary(POS.float(), Q, K, CACHE), r"rotary: positions must be a 1-D int64 or int32 tensor, got Float"),
    (
        lambda: ops.linear(torch.randn(3, 9), PACKED, None, 20),
        r"linear: x has 9 features but the packed weight takes 8",
    ),
    (lambda: ops.linear(torch.randn(8), PACKED, None, 20), r"linear: x must be 2-D"),
    (lambda: ops.linear(X, PACKED, torch.randn(19), 20), r"linear: bias must be \[20\], got shape \[19\]"),
    (lambda: ops.linear(X, PACKED, None, 33), r"linear: out_features 33 does not fit a packed weight of 2 panels"),
    (lambda: ops.linear(X, PACKED, None, 16), r"out_features 16 does not fit"),
    (
        lambda: ops.linear(X, torch.randn(20, 8), None, 20),
        r"linear: packed must be a contiguous \[panels, in_features, 16\]",
    ),
    (lambda: ops.pack_linear(torch.randn(20)), r"pack_linear: weight must be 2-D \[out_features, in_features\]"),
    (lambda: ops.pack_linear(torch.randn(4, 4).double()), r"pack_linear: weight dtype Double not supported"),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS, ids=[str(i) for i in range(len(BAD_CALLS))])
def test_bad_input_is_refused_with_a_message_naming_it(call: Callable[[], object], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()


def test_linear_above_max_rows_uses_the_prepacked_onednn_weight_where_supported() -> None:
    """fp32 batches past the native kernel's rows run oneDNN on a weight reordered once at load."""
    cpu = CpuFusedOps({torch.float32: 8})
    wide = rand(48, 100, dtype=torch.float32, seed=3)
    w = wide[:, 10:74].t()  # a strided [64, 48] view: packing must not read past it
    b = rand(64, dtype=torch.float32, seed=4)
    packed = cpu.pack_linear(w, b)
    assert packed.packed is not None
    if packed.packed.onednn is None:
        pytest.skip("this torch build or CPU has no fp32 oneDNN linear")
    for rows in (9, 40, 300):
        x = rand(rows, 48, dtype=torch.float32, seed=rows)
        got = cpu.linear(x, packed)
        assert_matches(got, oracle_linear(x, w, b), exact_share=0.0, atol=sum_error(x, w))
