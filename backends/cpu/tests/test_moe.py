"""Routed experts (``CpuFusedOps.pack_experts`` / ``moe``, ``paged_cpu::moe``) against what they promise.

* Packed experts: bit for bit what the packed linear computes for each (token, expert) alone: ``quant_linear`` on the
  expert's gate_up rows, ``silu_and_mul``, ``quant_linear`` on its down rows, all in fp32, then the slots summed in
  order in fp32 and rounded once (the op groups tokens by expert and runs the same kernels on the groups: a row's
  bits do not depend on its group). In each activation mode of q4_0 / q4_1 (int8, and fp32), with and without the
  interleaved copy, and the mixed layers GGUF files have.
* Dense experts and the tanh-GELU gate: within a stated tolerance of float64 arithmetic (see :func:`assert_close`).
* Edge cases: no tokens, experts no token chose, every token to one expert, strided and converted inputs, calls
  longer than one pass of the op's scratch; batch invariance on two threads; the portable kernels; tracing; refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from paged_backend_cpu import CpuFusedOps, fused_moe, ops
from paged_core.api import (
    LINEAR_FORMATS,
    FusedOps,
    MoERouting,
    PackedExperts,
    QuantizedWeight,
    UnsupportedConfigError,
    route_experts,
)
from paged_core.testing import dequantize, random_packed

REF = FusedOps()
PACKED = ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "int8"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ExpertWeight = torch.Tensor | QuantizedWeight


@pytest.fixture
def activations() -> Iterator[Callable[[str], str]]:
    """``activations(mode)`` sets ``ops.set_linear_activations`` for one test; the previous mode comes back."""
    before = ops.linear_activations()
    yield ops.set_linear_activations
    ops.set_linear_activations(before)


@pytest.fixture
def threads() -> Iterator[Callable[[int], None]]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def packed_layer(
    fmt: str, experts: int, hidden: int, inter: int, seed: int, down_fmt: str | None = None
) -> tuple[QuantizedWeight, QuantizedWeight]:
    g = gen(seed)
    gate_up = random_packed(LINEAR_FORMATS[fmt], experts * 2 * inter, hidden, g, scale=hidden**-0.5)
    down = random_packed(LINEAR_FORMATS[down_fmt or fmt], experts * hidden, inter, g, scale=inter**-0.5)
    return gate_up, down


def dense_layer(
    experts: int, hidden: int, inter: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    return gate_up.to(dtype), down.to(dtype)


def logits_for(tokens: int, experts: int, seed: int, chosen: list[int] | None = None) -> torch.Tensor:
    """Random logits at least 0.05 apart per token (no near ties); ``chosen``: only those experts are ever picked."""
    g = gen(seed)
    ranks = torch.stack([torch.randperm(experts, generator=g) for _ in range(tokens)]).float() if tokens else None
    logits = torch.zeros(tokens, experts) if ranks is None else ranks * 0.1
    if chosen is not None:
        mask = torch.full((experts,), -30.0)
        mask[chosen] = 0.0
        logits = logits + mask
    return logits


def composed(x: torch.Tensor, logits: torch.Tensor, experts: PackedExperts, routing: MoERouting) -> torch.Tensor:
    """The packed linear's arithmetic per (token, expert), one at a time (CpuFusedOps' own linear ops)."""
    packed = experts.packed
    cpu = CpuFusedOps(interleave=packed.gate_up.interleaved is not None or packed.down.interleaved is not None)
    weights, ids = route_experts(logits, routing)
    xf = x.float()
    out = torch.empty(x.shape[0], experts.hidden_size)
    for t in range(x.shape[0]):
        acc = None
        for j in range(ids.shape[1]):
            gate_up, down = experts.expert(int(ids[t, j]))
            h = cpu.linear(xf[t : t + 1], cpu.pack_linear(gate_up))
            y = cpu.linear(ops.silu_and_mul(h), cpu.pack_linear(down))
            term = y * weights[t : t + 1, j : j + 1]
            acc = term if acc is None else acc + term
        assert acc is not None
        out[t] = acc[0]
    return out.to(x.dtype)


def oracle64(
    x: torch.Tensor, logits: torch.Tensor, gate_up: ExpertWeight, down: ExpertWeight, r: MoERouting
) -> torch.Tensor:
    """Routed experts in float64 (weights dequantized exactly), per token."""
    weights, ids = route_experts(logits, r)
    e = r.num_experts
    gu = (dequantize(gate_up) if isinstance(gate_up, QuantizedWeight) else gate_up).double().reshape(e, -1, x.shape[1])
    dn = (dequantize(down) if isinstance(down, QuantizedWeight) else down).double().reshape(e, x.shape[1], -1)
    inter = dn.shape[2]
    act = {"silu": torch.nn.functional.silu, "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for j in range(ids.shape[1]):
        idx = ids[:, j].long()
        h = torch.einsum("tnk,tk->tn", gu[idx], x.double())
        a = act[r.activation](h[:, :inter]) * h[:, inter:]
        out += weights[:, j : j + 1].double() * torch.einsum("thi,ti->th", dn[idx], a)
    return out


def assert_close(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> None:
    """``|got - exact| <= 1e-5 * max|exact| + rel * |exact|``, ``rel`` 1e-5 for float32 and one ulp of the 16-bit
    types (their one rounding). A wrong weight moves outputs by about 1e-2 of their scale here."""
    rel = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    err = (got.double() - exact).abs()
    tol = 1e-5 * float(exact.abs().max()) + rel * exact.abs()
    assert got.dtype == dtype
    assert bool((err <= tol).all()), f"max error {float(err.max()):.3g}, {int((err > tol).sum())} outside"


# ---- packed experts: the packed linear's bits ----


@pytest.mark.parametrize("fmt", PACKED)
@pytest.mark.parametrize("mode", ["int8", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_experts_are_the_packed_linear_per_token(
    fmt: str, mode: str, dtype: torch.dtype, activations: Callable[[str], str]
) -> None:
    activations(mode)
    block = LINEAR_FORMATS[fmt].block_size
    hidden, inter = (256, 256) if block == 256 else (64, 96)
    gate_up, down = packed_layer(fmt, 8, hidden, inter, seed=len(fmt))
    experts = CpuFusedOps().pack_experts(gate_up, down)
    assert isinstance(experts.packed, fused_moe.CpuExperts)
    routing = MoERouting(8, 3, renormalize=True)
    # 1 token, a few, and enough that experts get more rows than the streaming paths take (the dequantize path).
    for tokens in (1, 5, 40):
        x = torch.randn(tokens, hidden, generator=gen(tokens)).to(dtype)
        logits = logits_for(tokens, 8, seed=tokens)
        got = CpuFusedOps().moe(x, logits, experts, routing)
        assert torch.equal(got, composed(x, logits, experts, routing))


@pytest.mark.parametrize(("fmt", "down_fmt"), [("q4_k", "q6_k"), ("q4_0", "q8_0"), ("q8_0", "q4_1")])
def test_mixed_formats(fmt: str, down_fmt: str, activations: Callable[[str], str]) -> None:
    activations("int8")
    gate_up, down = packed_layer(fmt, 6, 256, 256, seed=3, down_fmt=down_fmt)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    routing = MoERouting(6, 2, renormalize=False)
    x, logits = torch.randn(9, 256, generator=gen(1)), logits_for(9, 6, seed=2)
    assert torch.equal(CpuFusedOps().moe(x, logits, experts, routing), composed(x, logits, experts, routing))


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1"])
def test_q4_without_the_interleaved_copy(fmt: str, activations: Callable[[str], str]) -> None:
    activations("int8")
    gate_up, down = packed_layer(fmt, 4, 64, 64, seed=5)
    plain = CpuFusedOps(interleave=False).pack_experts(gate_up, down)
    interleaved = CpuFusedOps().pack_experts(gate_up, down)
    assert plain.packed.gate_up.interleaved is None and interleaved.packed.gate_up.interleaved is not None
    routing = MoERouting(4, 2, renormalize=True)
    x, logits = torch.randn(6, 64, generator=gen(6)), logits_for(6, 4, seed=6)
    got = CpuFusedOps().moe(x, logits, plain, routing)
    assert torch.equal(got, composed(x, logits, plain, routing))
    # The int8 rule is one rule: the interleaved layout differs only in the order of fp32 sums.
    assert_close(got, CpuFusedOps().moe(x, logits, interleaved, routing).double(), torch.float32)


def test_int8x2_linears_leave_experts_at_one_int8_level(activations: Callable[[str], str]) -> None:
    """Experts follow ``linear_activations`` except that int8x2 rounds them once (the contract's declared rounding)."""
    gate_up, down = packed_layer("q4_0", 4, 64, 64, seed=7)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    routing = MoERouting(4, 2, renormalize=True)
    x, logits = torch.randn(3, 64, generator=gen(7)), logits_for(3, 4, seed=7)
    activations("int8x2")
    twice = CpuFusedOps().moe(x, logits, experts, routing)
    activations("int8")
    assert torch.equal(twice, CpuFusedOps().moe(x, logits, experts, routing))


# ---- dense experts, the GELU gate: float64 arithmetic ----


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(("hidden", "inter"), [(64, 48), (67, 45)])
def test_dense_experts(dtype: torch.dtype, activation: str, hidden: int, inter: int) -> None:
    gate_up, down = dense_layer(8, hidden, inter, dtype, seed=hidden)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    assert isinstance(experts.packed, fused_moe.CpuExperts)
    routing = MoERouting(8, 2, scoring="sigmoid", renormalize=True, activation=activation, routed_scaling=2.5)  # type: ignore[arg-type]
    for tokens in (1, 7, 30):
        x = torch.randn(tokens, hidden, generator=gen(tokens)).to(dtype)
        logits = logits_for(tokens, 8, seed=tokens + 1)
        got = CpuFusedOps().moe(x, logits, experts, routing)
        assert_close(got, oracle64(x, logits, gate_up, down, routing), dtype)


@pytest.mark.parametrize("fmt", ["q4_k", "int8"])
def test_gelu_gate_on_packed_experts(fmt: str) -> None:
    gate_up, down = packed_layer(fmt, 4, 256, 256, seed=11)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    routing = MoERouting(4, 2, renormalize=False, activation="gelu_tanh")
    x, logits = torch.randn(5, 256, generator=gen(11)), logits_for(5, 4, seed=11)
    assert_close(
        CpuFusedOps().moe(x, logits, experts, routing), oracle64(x, logits, gate_up, down, routing), torch.float32
    )


# ---- edge cases ----


def test_no_tokens() -> None:
    gate_up, down = packed_layer("q8_0", 4, 64, 32, seed=1)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    out = CpuFusedOps().moe(
        torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(0, 4), experts, MoERouting(4, 2, renormalize=True)
    )
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", ["q4_0", "q6_k", "dense"])
def test_empty_experts_and_every_token_to_one_expert(fmt: str, activations: Callable[[str], str]) -> None:
    """Experts no token chose are skipped (their bytes may be anything); one expert may take every token."""
    activations("int8")
    hidden = inter = 256
    gate_up: ExpertWeight
    down: ExpertWeight
    if fmt == "dense":
        gate_up, down = dense_layer(8, hidden, inter, torch.float32, 2)
    else:
        gate_up, down = packed_layer(fmt, 8, hidden, inter, 2)
    # Experts 0, 5 and 6 never chosen: NaN in their weights (packed: NaN fp16 scales) must not reach any output.
    poisoned: list[ExpertWeight] = []
    for w, rows in ((gate_up, 2 * inter), (down, hidden)):
        if isinstance(w, QuantizedWeight):
            data = w.data.clone().view(8, rows, -1)
            data[[0, 5, 6]] = 0xFF
            poisoned.append(QuantizedWeight(w.format, w.shape, data.view(w.data.shape), w.scale, w.name))
        else:
            p = w.clone()
            p[[0, 5, 6]] = float("nan")
            poisoned.append(p)
    experts = CpuFusedOps().pack_experts(poisoned[0], poisoned[1])
    routing = MoERouting(8, 2, renormalize=True)
    x = torch.randn(70, hidden, generator=gen(3))
    for chosen in ([1, 2, 3, 4, 7], [3, 4]):  # [3, 4]: every token takes both, 70 rows each
        logits = logits_for(70, 8, seed=len(chosen), chosen=chosen)
        got = CpuFusedOps().moe(x, logits, experts, routing)
        assert torch.isfinite(got).all()
        if fmt == "dense":
            assert_close(got, oracle64(x, logits, gate_up, down, routing), torch.float32)
        else:
            assert torch.equal(got, composed(x, logits, experts, routing))


@pytest.mark.parametrize("fmt", ["q4_1", "q4_k", "dense"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_and_converted_inputs(fmt: str, dtype: torch.dtype) -> None:
    """``x`` and the logits as column views of wider buffers, and logits in ``x``'s dtype, give the same bits."""
    hidden = 64 if fmt == "dense" else 256
    gate_up, down = dense_layer(4, hidden, 64, dtype, 4) if fmt == "dense" else packed_layer(fmt, 4, hidden, 256, 4)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    routing = MoERouting(4, 2, renormalize=True)
    x = torch.randn(9, hidden, generator=gen(5)).to(dtype)
    logits = logits_for(9, 4, seed=5).to(dtype)
    want = CpuFusedOps().moe(x, logits.float(), experts, routing)
    wide_x = torch.full((9, hidden + 11), float("nan"), dtype=dtype)
    wide_x[:, 3 : 3 + hidden] = x
    wide_l = torch.full((9, 16), float("nan"), dtype=dtype)
    wide_l[:, 5:9] = logits
    assert torch.equal(CpuFusedOps().moe(x, logits, experts, routing), want)
    assert torch.equal(CpuFusedOps().moe(wide_x[:, 3 : 3 + hidden], wide_l[:, 5:9], experts, routing), want)
    assert torch.equal(CpuFusedOps().moe(x.t().contiguous().t(), logits, experts, routing), want)


def test_a_call_longer_than_one_pass() -> None:
    """Calls whose scratch exceeds one pass (32M floats: 160 per slot here, 26214 tokens of 8 slots) go in chunks of
    tokens: every token as it is alone."""
    gate_up, down = dense_layer(8, 32, 32, torch.float32, 6)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    routing = MoERouting(8, 8, renormalize=False)
    tokens = 30000
    x, logits = torch.randn(tokens, 32, generator=gen(8)), torch.randn(tokens, 8, generator=gen(9))
    got = CpuFusedOps().moe(x, logits, experts, routing)
    for rows in (slice(0, 3), slice(26210, 26216), slice(tokens - 3, tokens)):
        assert torch.equal(got[rows], CpuFusedOps().moe(x[rows], logits[rows], experts, routing))


@pytest.mark.parametrize("kind", ["q4_0", "q8_0", "q6_k", "bfloat16"])
def test_batch_invariant_on_two_threads(kind: str, threads: Callable[[int], None]) -> None:
    threads(2)
    gate_up: ExpertWeight
    down: ExpertWeight
    if kind in LINEAR_FORMATS:
        gate_up, down = packed_layer(kind, 8, 256, 256, 10)
    else:
        gate_up, down = dense_layer(8, 256, 256, getattr(torch, kind), 10)
    experts = CpuFusedOps().pack_experts(gate_up, down)
    routing = MoERouting(8, 2, renormalize=True)
    x, logits = torch.randn(37, 256, generator=gen(10)), logits_for(37, 8, seed=10)
    full = CpuFusedOps().moe(x, logits, experts, routing)
    for rows in ([0], [36], [3, 30], list(range(5, 25))):
        assert torch.equal(CpuFusedOps().moe(x[rows], logits[rows], experts, routing), full[rows])


def test_portable_kernels(use_isa: Callable[[str], str], activations: Callable[[str], str]) -> None:
    """With the portable build forced (no AVX2), packed experts still follow quant_linear and dense ones float64."""
    use_isa("scalar")
    ops.set_quant_isa("scalar")
    try:
        activations("int8")
        gate_up, down = packed_layer("q4_0", 4, 64, 64, 12)
        experts = CpuFusedOps().pack_experts(gate_up, down)
        routing = MoERouting(4, 2, renormalize=True)
        x, logits = torch.randn(5, 64, generator=gen(12)), logits_for(5, 4, seed=12)
        assert torch.equal(CpuFusedOps().moe(x, logits, experts, routing), composed(x, logits, experts, routing))
        for activation in ("silu", "gelu_tanh"):
            r = MoERouting(4, 2, renormalize=True, activation=activation)
            dense = dense_layer(4, 40, 24, torch.bfloat16, 13)
            got = CpuFusedOps().moe(x[:, :40].bfloat16(), logits, CpuFusedOps().pack_experts(*dense), r)
            assert_close(got, oracle64(x[:, :40].bfloat16(), logits, dense[0], dense[1], r), torch.bfloat16)
    finally:
        ops.set_quant_isa("auto")


# ---- what is not the op's: the reference ----


def test_experts_it_did_not_pack_go_to_the_reference() -> None:
    gate_up, down = packed_layer("q4_k", 4, 256, 256, 14)
    routing = MoERouting(4, 2, renormalize=True)
    x, logits = torch.randn(3, 256, generator=gen(14)), logits_for(3, 4, seed=14)
    reference_packed = REF.pack_experts(gate_up, down)
    assert torch.equal(
        CpuFusedOps().moe(x, logits, reference_packed, routing), REF.moe(x, logits, reference_packed, routing)
    )

    class Q8Only(CpuFusedOps):
        moe_formats = frozenset({"q8_0"})

    assert Q8Only().pack_experts(gate_up, down).packed is None
    assert CpuFusedOps().pack_experts(gate_up.to("meta"), down.to("meta")).packed is None
    assert CpuFusedOps().pack_experts(*dense_layer(4, 8, 8, torch.float64, 1)).packed is None


# ---- tracing, the op's schema, refusals ----


@pytest.mark.parametrize("kind", ["q4_0", "dense"])
def test_traces_as_one_graph(kind: str) -> None:
    torch._dynamo.reset()
    layer = packed_layer("q4_0", 4, 64, 64, 15) if kind == "q4_0" else dense_layer(4, 64, 64, torch.bfloat16, 15)
    experts = CpuFusedOps().pack_experts(*layer)
    routing = MoERouting(4, 2, renormalize=True)
    cpu = CpuFusedOps()

    def fn(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return cpu.moe(x, logits, experts, routing)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    dtype = torch.float32 if kind == "q4_0" else torch.bfloat16
    for tokens in (3, 8):
        x, logits = torch.randn(tokens, 64, generator=gen(tokens)).to(dtype), logits_for(tokens, 4, seed=tokens)
        assert torch.equal(compiled(x, logits), fn(x, logits))


def test_opcheck() -> None:
    gate_up, down = packed_layer("q8_0", 4, 64, 32, 16)
    w, ids = route_experts(logits_for(3, 4, seed=16), MoERouting(4, 2, renormalize=True))
    gu = ops.MoEProjection(gate_up.data, None, None, ops.QUANT_FORMATS["q8_0"], 8)
    dn = ops.MoEProjection(down.data, None, None, ops.QUANT_FORMATS["q8_0"], 8)
    torch.library.opcheck(torch.ops.paged_cpu.moe.default, (torch.randn(3, 64), w, ids, *gu, *dn, 0))


def _op_call(**change: object) -> Callable[[], object]:
    gate_up, down = packed_layer("q8_0", 4, 64, 32, 17)
    args: dict[str, object] = {
        "x": torch.randn(3, 64),
        "weights": torch.ones(3, 2),
        "ids": torch.zeros(3, 2, dtype=torch.int32),
        "gate_up": ops.MoEProjection(gate_up.data, None, None, ops.QUANT_FORMATS["q8_0"], 8),
        "down": ops.MoEProjection(down.data, None, None, ops.QUANT_FORMATS["q8_0"], 8),
        "activation": 0,
    }
    args.update(change)
    return lambda: ops.moe(**args)  # type: ignore[arg-type]


BAD_OP_CALLS: list[tuple[Callable[[], object], str]] = [
    (
        _op_call(ids=torch.tensor([[0, 1], [4, 0], [0, 0]], dtype=torch.int32)),
        r"ids\[1, 0\] = 4 is not an expert \(0 \.\. 3\)",
    ),
    (_op_call(ids=torch.full((3, 2), -1, dtype=torch.int32)), r"ids\[0, 0\] = -1 is not an expert"),
    (_op_call(ids=torch.zeros(3, 2, dtype=torch.int64)), r"weights and ids must be float32 and int32 \[3, k\]"),
    (_op_call(x=torch.randn(3, 48)), r"packed down must be \(E \* 48\) rows"),
    (_op_call(x=torch.randn(3, 64).double()), r"x dtype Double not supported"),
    (_op_call(activation=2), r"activation must be 0 \(silu\) or 1 \(gelu_tanh\)"),
    (
        _op_call(gate_up=ops.MoEProjection(torch.zeros(4 * 64, 70, dtype=torch.uint8), None, None, 2, 8)),
        r"packed gate_up must be a Byte \[256, 68\] tensor \(4 experts of 64 q8_0 rows of 64 inputs\)",
    ),
    (
        _op_call(gate_up=ops.MoEProjection(torch.zeros(4, 60, 64), None, None, ops.MOE_DENSE, 0)),
        r"dense gate_up must be \[4, 64, 64\]",
    ),
    (
        _op_call(gate_up=ops.MoEProjection(torch.zeros(256, 64, dtype=torch.int8), None, None, 5, 8)),
        r"int8 gate_up needs scale",
    ),
    (
        _op_call(
            gate_up=ops.MoEProjection(
                torch.zeros(256, 36, dtype=torch.uint8), None, torch.zeros(32, 280, dtype=torch.uint8), 0, 4
            )
        ),
        r"gate_up interleaved must be a contiguous uint8 \[32, 288\]",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD_OP_CALLS, ids=[str(i) for i in range(len(BAD_OP_CALLS))])
def test_bad_op_input_is_refused_naming_it(call: Callable[[], object], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()


def test_layouts_and_inputs_that_do_not_fit_are_refused() -> None:
    cpu = CpuFusedOps()
    with pytest.raises(UnsupportedConfigError, match="2I = 47 is odd"):
        cpu.pack_experts(torch.zeros(4, 47, 32), torch.zeros(4, 32, 24))
    experts = cpu.pack_experts(*dense_layer(4, 32, 24, torch.float32, 1))
    x, logits = torch.zeros(3, 32), torch.zeros(3, 4)
    with pytest.raises(UnsupportedConfigError, match="num_experts = 8"):
        cpu.moe(x, torch.zeros(3, 8), experts, MoERouting(8, 2, renormalize=True))
    with pytest.raises(UnsupportedConfigError, match=r"moe x \(3, 31\): the experts need \[T, 32\]"):
        cpu.moe(torch.zeros(3, 31), logits, experts, MoERouting(4, 2, renormalize=True))
    with pytest.raises(UnsupportedConfigError, match=r"router_logits \(2, 4\)"):
        cpu.moe(x, logits[:2], experts, MoERouting(4, 2, renormalize=True))


def test_declarations() -> None:
    assert CpuFusedOps.moe_formats == CpuFusedOps.linear_formats
    assert CpuFusedOps.batch_invariant_moe == CpuFusedOps.linear_formats | {"float32", "bfloat16", "float16"}
