"""The routing op (``paged_cpu::moe_route``, ``fused_moe.route``, ``CpuFusedOps.moe``) against ``route_experts``.

* The ids: equal to ``route_experts``' (the same experts in the same slots), exact ties to the lower id included.
* The weights: softmax ones bit for bit on x86-64 (the op re-traces torch's softmax and sum for the capability torch
  dispatches to: AVX-512 here, AVX2 and the generic build in subprocesses); sigmoid ones bit for bit but for the
  logits torch's elementwise kernel leaves to its scalar loop (another exp, whose last bit becomes up to 4 ulps of a
  weight): the op uses the vector loop's exp for every token, so that a token's weights do not depend on the batch.
* fp32, bf16 and fp16 logits, contiguous, rows apart and transposed; 0, 1, 7 and 130 tokens; top-k 1 to 8 of 4 to
  128 experts; NaN and -inf logits; each token's routing its own (batch-invariant); tracing, the schema; ``moe``
  routed this way is the reference's.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

from paged_backend_cpu import CpuFusedOps, fused_moe, ops
from paged_core.api import FusedOps, MoERouting, PackedExperts, route_experts

X86 = platform.machine().lower() in ("x86_64", "amd64")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(4, 1), (4, 4), (7, 3), (16, 2), (32, 2), (32, 8), (60, 5), (128, 8)]  # (experts, top_k)


@pytest.fixture
def threads() -> Iterator[Callable[[int], None]]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def logits(tokens: int, experts: int, dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    """Router logits ``[tokens, experts]`` in ``dtype``: ``contiguous``, ``rows`` (a slice of wider rows) or
    ``transposed`` (a view of ``[experts, tokens]``)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "rows":
        return (torch.randn(tokens, experts + 5, generator=g) * 2).to(dtype)[:, 2 : experts + 2]
    if layout == "transposed":
        return (torch.randn(experts, tokens, generator=g) * 2).to(dtype).t()
    return (torch.randn(tokens, experts, generator=g) * 2).to(dtype)


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in ulps between two fp32 tensors of one sign (0 when empty)."""
    if a.numel() == 0:
        return 0
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


SIGMOID_RTOL = 2.0**-21
"""Sigmoid weights against torch's: one exp's last bit (SLEEF's or libm's) becomes up to 2 ulps through 1 / (1 + e),
and a little more through the renormalising division and the scaling (3 ulps measured): 4 ulps of relative error."""


def assert_sigmoid_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    torch.testing.assert_close(got, want, rtol=SIGMOID_RTOL, atol=0, equal_nan=True, msg=what or None)


def op_route(x: torch.Tensor, routing: MoERouting) -> tuple[torch.Tensor, torch.Tensor]:
    scoring = ops.MOE_SCORINGS[routing.scoring]
    return ops.moe_route(x, routing.top_k, scoring, routing.renormalize, float(routing.routed_scaling))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("scaling", [1.0, 2.5])
@pytest.mark.parametrize("layout", ["contiguous", "rows", "transposed"])
def test_route_is_route_experts(scoring: str, renormalize: bool, scaling: float, layout: str) -> None:
    for seed, ((experts, top_k), dtype, tokens) in enumerate(
        (shape, dtype, tokens) for shape in SHAPES for dtype in DTYPES for tokens in (0, 1, 7, 130)
    ):
        routing = MoERouting(experts, top_k, scoring, renormalize=renormalize, routed_scaling=scaling)  # type: ignore[arg-type]
        x = logits(tokens, experts, dtype, layout, seed)
        want_w, want_ids = route_experts(x, routing)
        w, ids = op_route(x, routing)
        what = f"E={experts} k={top_k} {dtype} T={tokens}"
        assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.is_contiguous() and ids.is_contiguous()
        assert torch.equal(ids, want_ids), what
        if scoring == "softmax" and X86:
            assert torch.equal(w.view(torch.int32), want_w.view(torch.int32)), f"{what}: {ulps(w, want_w)} ulps"
        else:
            assert_sigmoid_close(w, want_w, what)


def test_sigmoid_over_its_whole_range() -> None:
    routing = MoERouting(60, 60, "sigmoid", renormalize=False)
    x = logits(130, 60, torch.float32, "contiguous", 1) * 12  # every score, the saturated ones included
    w, ids = op_route(x, routing)
    want_w, want_ids = route_experts(x, routing)
    assert torch.equal(ids, want_ids)
    assert_sigmoid_close(w, want_w)
    # Only torch's scalar tail may differ: with AVX-512 the batch's last (130 * 60) % 32 = 24 logits.
    assert int((w != want_w).sum()) <= 24


def test_exact_ties_go_to_the_lower_expert() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (130, 32), generator=g).float()  # five values among 32 experts: ties everywhere
    x[0] = 0.0  # a whole row tied: experts 0 .. k-1
    x[1, 5] = -0.0  # -0 ties with 0
    for top_k in (1, 2, 8):
        for routing in (MoERouting(32, top_k, renormalize=True), MoERouting(32, top_k, "sigmoid", renormalize=False)):
            w, ids = op_route(x, routing)
            want_w, want_ids = route_experts(x, routing)
            assert torch.equal(ids, want_ids)
            assert torch.equal(ids[0], torch.arange(top_k, dtype=torch.int32))
            assert_sigmoid_close(w, want_w)
    # bf16 rounding makes distinct fp32 logits equal: the tie is on the logits the op reads.
    xb = (torch.randn(64, 16, generator=g) * 0.01 + 1).bfloat16()
    assert torch.equal(
        op_route(xb, MoERouting(16, 4, renormalize=True))[1], route_experts(xb, MoERouting(16, 4, renormalize=True))[1]
    )


def test_nan_and_masked_logits() -> None:
    x = logits(8, 16, torch.float32, "contiguous", 4)
    x[1, 3] = float("nan")  # NaN sorts above everything; its softmax row is NaN
    x[2, :12] = float("-inf")  # masked experts are never chosen while others are left
    x[3, :] = float("-inf")
    x[3, 9] = 0.0
    for routing in (MoERouting(16, 4, renormalize=True), MoERouting(16, 2, "sigmoid", renormalize=False)):
        w, ids = op_route(x, routing)
        want_w, want_ids = route_experts(x, routing)
        assert torch.equal(ids, want_ids)
        assert torch.equal(w.isnan(), want_w.isnan())
        if routing.scoring == "softmax" and X86:
            assert torch.equal(w.nan_to_num().view(torch.int32), want_w.nan_to_num().view(torch.int32))
        assert_sigmoid_close(w, want_w)
        assert ids[1, 0] == 3 and w[1].isnan().all() == (routing.scoring == "softmax")
        assert (ids[2] >= 12).all() and ids[3, 0] == 9


def test_no_tokens_and_one_expert() -> None:
    w, ids = op_route(torch.zeros(0, 8, dtype=torch.bfloat16), MoERouting(8, 3, renormalize=True))
    assert w.shape == ids.shape == (0, 3) and w.dtype == torch.float32 and ids.dtype == torch.int32
    w, ids = op_route(torch.tensor([[0.5], [-3.0]]), MoERouting(1, 1, renormalize=True))
    assert torch.equal(ids, torch.zeros(2, 1, dtype=torch.int32)) and torch.equal(w, torch.ones(2, 1))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_each_token_routes_alone(scoring: str, threads: Callable[[int], None]) -> None:
    """Batch invariance: a token's weights and ids are the same bits in a call of 1, 7 or 1500 tokens, on 2 threads
    (torch's own sigmoid is not: it computes a batch's last logits with another exp)."""
    threads(2)
    routing = MoERouting(32, 4, scoring, renormalize=True, routed_scaling=1.5)  # type: ignore[arg-type]
    x = logits(1500, 32, torch.float32, "contiguous", 5)
    w, ids = op_route(x, routing)
    for rows in (slice(0, 1), slice(1493, 1500), slice(700, 707)):
        w_part, ids_part = op_route(x[rows], routing)
        assert torch.equal(ids_part, ids[rows]) and torch.equal(w_part.view(torch.int32), w[rows].view(torch.int32))
    for t in (0, 31, 1499):
        w_one, ids_one = op_route(x[t : t + 1].clone(), routing)
        assert torch.equal(ids_one, ids[t : t + 1]) and torch.equal(w_one, w[t : t + 1])


_CAPABILITY_CHECK = """
import torch
from paged_backend_cpu import ops
from paged_core.api import MoERouting, route_experts
print(torch.backends.cpu.get_cpu_capability())
g = torch.Generator().manual_seed(0)
for experts, top_k in ((4, 2), (7, 5), (16, 8), (32, 2), (60, 8), (128, 8)):
    for renormalize in (False, True):
        routing = MoERouting(experts, top_k, renormalize=renormalize, routed_scaling=2.5)
        for tokens in (1, 7, 130):
            x = torch.randn(tokens, experts, generator=g) * 2
            w, ids = ops.moe_route(x, top_k, 0, renormalize, 2.5)
            want_w, want_ids = route_experts(x, routing)
            assert torch.equal(ids, want_ids), (experts, top_k, tokens)
            assert torch.equal(w.view(torch.int32), want_w.view(torch.int32)), (experts, top_k, tokens)
print("ok")
"""


@pytest.mark.skipif(not X86, reason="torch's CPU capabilities AVX2 / AVX512 are x86-64's")
@pytest.mark.parametrize("capability", ["AVX2", "DEFAULT"])
def test_softmax_bits_under_each_torch_capability(capability: str) -> None:
    """torch's softmax differs by capability (16 or 8 lanes, SLEEF's or libm's exp): the op follows the one chosen.
    The machine's own (AVX512 here) is the main test's; the lower ones run in a process started with
    ``ATEN_CPU_CAPABILITY``."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability.lower(), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", _CAPABILITY_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [capability, "ok"]


def test_route_falls_back_to_route_experts() -> None:
    """Logits the op does not read (float64) are routed by ``route_experts`` itself."""
    x = logits(5, 8, torch.float64, "contiguous", 6)
    routing = MoERouting(8, 2, renormalize=True)
    w, ids = fused_moe.route(x, routing)
    want_w, want_ids = route_experts(x, routing)
    assert torch.equal(ids, want_ids) and torch.equal(w, want_w)


def test_moe_routes_with_the_op() -> None:
    """``CpuFusedOps.moe`` = the refusals, ``moe_route`` and ``experts``: the reference's output from its routing."""
    g = torch.Generator().manual_seed(7)
    gate_up, down = torch.randn(8, 2 * 24, 32, generator=g) / 6, torch.randn(8, 32, 24, generator=g) / 5
    cpu = CpuFusedOps()
    experts = cpu.pack_experts(gate_up, down)
    assert experts.packed is not None
    routing = MoERouting(8, 3, "sigmoid", renormalize=True, routed_scaling=2.0)
    for tokens in (0, 1, 9):
        x = torch.randn(tokens, 32, generator=g)
        lg = logits(tokens, 8, torch.bfloat16, "rows", tokens)
        w, ids = fused_moe.route(lg, routing)
        assert torch.equal(cpu.moe(x, lg, experts, routing), cpu.experts(x, w, ids, experts))
        want = FusedOps().moe(x, lg, PackedExperts(gate_up, down), routing)
        torch.testing.assert_close(cpu.moe(x, lg, experts, routing), want, rtol=1e-5, atol=1e-5)


def test_traces_and_opcheck() -> None:
    torch._dynamo.reset()
    routing = MoERouting(16, 4, renormalize=True)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_moe.route(x, routing)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for tokens in (3, 8):
        x = logits(tokens, 16, torch.bfloat16, "contiguous", tokens)
        got, want = compiled(x), fn(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    x = logits(5, 16, torch.float32, "contiguous", 8)
    torch.library.opcheck(torch.ops.paged_cpu.moe_route.default, (x, 4, 0, True, 1.0))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.zeros(4), 1, 0, True, 1.0), r"logits must be a 2-D cpu tensor"),
        ((torch.zeros(2, 4, dtype=torch.float64), 1, 0, True, 1.0), r"logits dtype Double not supported"),
        ((torch.zeros(2, 4), 5, 0, True, 1.0), r"top_k = 5 must be in 1 \.\. 4"),
        ((torch.zeros(2, 4), 0, 0, True, 1.0), r"top_k = 0 must be in 1 \.\. 4"),
        ((torch.zeros(2, 4), 2, 2, True, 1.0), r"scoring must be 0 \(softmax\) or 1 \(sigmoid\)"),
    ],
)
def test_bad_input_is_refused_naming_it(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        ops.moe_route(*args)  # type: ignore[arg-type]
