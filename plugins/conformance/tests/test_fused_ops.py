"""The fused-op checks: the reference and a correct reimplementation pass; each planted bug fails where it should.

Fakes are in ``fused_fakes``. Value bugs run the checks without the trace
test, trace bugs only the trace test (each nested run is a few seconds).
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.fused import (
    REFERENCE,
    Untouched,
    column_view,
    head_major_view,
    qkv_views,
    rope_cache,
    transposed_view,
)
from paged_conformance.grid import FUSED_OPS, LINEAR_FORMATS

VALUES = "fused_ops and not traces"
TRACES = "fused_ops and traces"
ROWS = [f"fused:{op}" for op in FUSED_OPS]


def _failed(report: dict) -> list[tuple[str, str]]:
    """(test function, parameter id) of every failed or errored test."""
    out = []
    for t in report["tests"]:
        if t["outcome"] in ("failed", "error"):
            name, _, param = t["nodeid"].split("::")[-1].partition("[")
            out.append((name, param.rstrip("]")))
    return out


def _messages(report: dict) -> list[str]:
    return [t["message"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _statuses(report: dict) -> dict[str, str]:
    """The ``fused:*`` rows of this section (``fused:moe`` is check_moe.py's, not selected by ``-k fused_ops``)."""
    rows = report["capabilities"].items()
    return {name: row["status"] for name, row in rows if name.startswith("fused:") and name != "fused:moe"}


def test_reference_passes_and_is_named(run_suite) -> None:
    code, report = run_suite("fused_fakes:FusedFakeBf16", "-k", "fused_ops")
    assert code == 0, _messages(report)
    assert set(_statuses(report).values()) == {"pass"} and len(_statuses(report)) == len(FUSED_OPS) + 1
    assert report["backend"]["fused_ops"] == {
        "name": "reference",
        "class": "paged_core.contract.fused_ops:FusedOps",
        "overrides": [],
        "linear_formats": list(LINEAR_FORMATS),
        "q8_activation_formats": [],
        "batch_invariant_linear": [],
        "batch_invariant_layer_ops": False,
        "moe_formats": list(LINEAR_FORMATS),
        "batch_invariant_moe": [],
    }
    counts = report["capabilities"]["fused:trace"]["counts"]
    assert counts["passed"] == len(FUSED_OPS)  # one dtype traced under quick
    assert report["grid"]["fused"]["ops"] == list(FUSED_OPS)


def test_a_correct_reimplementation_with_a_custom_op_passes(run_suite) -> None:
    code, report = run_suite("fused_fakes:Reimplemented", "-k", "fused_ops")
    assert code == 0, _messages(report)
    assert set(_statuses(report).values()) == {"pass"}
    info = report["backend"]["fused_ops"]
    assert info["class"] == "fused_fakes:ReimplementedOps" and info["name"] == "reimplemented"
    assert info["overrides"] == [
        "rms_norm",
        "add_rms_norm",
        "silu_and_mul",
        "rotary",
        "rotate_heads",
        "pack_linear",
        "linear",
    ]


# fake, the test functions that must fail (at float32, both layouts, unless `params` says otherwise), a message
# fragment of every failure. Fakes declare float32 only, but for LinearReturnsFloat32 (float32 and bfloat16).
VALUE_BUGS = [
    ("EpsOutsideSqrt", {"test_rms_norm", "test_add_rms_norm"}, None, "mismatch"),
    ("FixedEps", {"test_rms_norm", "test_add_rms_norm"}, None, "eps=1e-05) "),
    ("SwappedGateUp", {"test_silu_and_mul"}, None, "silu_and_mul(x ["),
    ("InterleavedRotary", {"test_rotary"}, None, "rotary(q ["),
    ("LinearIgnoresBias", {"test_linear"}, None, ", bias) mismatch"),
    ("RotaryInPlace", {"test_rotary"}, None, "modified its input query"),
    ("AddRmsNormInPlace", {"test_add_rms_norm"}, None, "modified its input residual in place"),
    ("PowerOfTwoPrefixRotation", {"test_rotate_heads"}, None, ", 80])"),
    ("RotateHeadsInPlace", {"test_rotate_heads"}, None, "modified its input x in place"),
    ("IgnoresStrides", {f"test_{op}" for op in FUSED_OPS}, {"float32-strided"}, "mismatch"),
    ("ReusesOutput", {"test_linear"}, None, "read back after later calls"),
    ("LinearReturnsFloat32", {"test_linear"}, {"bfloat16", "bfloat16-strided"}, "dtype torch.float32, expected"),
]


@pytest.mark.parametrize(("fake", "tests", "params", "fragment"), VALUE_BUGS, ids=[b[0] for b in VALUE_BUGS])
def test_planted_bug_fails_its_op_only(
    run_suite, fake: str, tests: set[str], params: set[str] | None, fragment: str
) -> None:
    code, report = run_suite(f"fused_fakes:{fake}", "-k", VALUES)
    failed = _failed(report)
    assert code != 0
    want_params = params or {"float32", "float32-strided"}
    assert set(failed) == {(t, p) for t in tests for p in want_params}, failed
    assert all(fragment in m for m in _messages(report)), _messages(report)
    statuses = _statuses(report)
    for op in FUSED_OPS:
        assert statuses[f"fused:{op}"] == ("fail" if f"test_{op}" in tests else "pass"), (op, statuses)


@pytest.mark.parametrize(
    ("fake", "op", "fragment"),
    [
        ("HostSync", "silu_and_mul", "reads tensors on the host"),
        ("NoFakeKernel", "rotary", "does not trace as one graph"),
    ],
)
def test_untraceable_op_fails_the_trace_only(run_suite, fake: str, op: str, fragment: str) -> None:
    code, report = run_suite(f"fused_fakes:{fake}", "-k", TRACES)
    assert code != 0
    assert _failed(report) == [("test_fused_op_traces", f"float32-strided-{op}")], _failed(report)
    assert fragment in _messages(report)[0]
    assert _statuses(report)["fused:trace"] == "fail"
    values_code, values = run_suite(f"fused_fakes:{fake}", "-k", f"{VALUES} and test_{op} and float32")
    assert values_code == 0, _messages(values)  # eager, the op is right


def test_fused_ops_hook_returning_something_else_fails(run_suite) -> None:
    code, report = run_suite("fused_fakes:NotFusedOps", "-k", "fused_ops and float32 and not strided")
    assert code != 0
    assert _messages(report) and all("fused_ops() returned object" in m for m in _messages(report))
    assert report["backend"]["fused_ops"]["class"] == "builtins:object"


# --- the building blocks -----------------------------------------------------------------------------------------


def test_rope_cache_layout_and_reference_pairing() -> None:
    """The cache is cos halves then sin halves; the reference pairs dimension i with i + D/2 (checked in float64)."""
    d, p = 8, 1234
    cache = rope_cache(d)
    freqs = 10000.0 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(cache[p].double(), torch.cat(((p * freqs).cos(), (p * freqs).sin())), atol=1e-6, rtol=0)
    q = torch.randn(1, 1, d, dtype=torch.float64)
    got, _ = REFERENCE.rotary(torch.tensor([p]), q.float(), q.float(), cache)
    angle = p * freqs
    z = torch.complex(q[0, 0, : d // 2], q[0, 0, d // 2 :]) * torch.exp(1j * angle)
    torch.testing.assert_close(got[0, 0].double(), torch.cat((z.real, z.imag)), atol=1e-5, rtol=0)


def test_reference_matches_float64_formulas() -> None:
    """The oracle itself: rms_norm with eps inside the root, silu of the first half, x @ w.T + b."""
    x, w = torch.randn(3, 10, dtype=torch.float64) * 1e-3, torch.randn(10, dtype=torch.float64)
    want = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w
    torch.testing.assert_close(REFERENCE.rms_norm(x.float(), w.float(), 1e-5).double(), want, atol=1e-5, rtol=1e-5)
    g = torch.randn(2, 12, dtype=torch.float64)
    want = g[:, :6] / (1 + (-g[:, :6]).exp()) * g[:, 6:]
    torch.testing.assert_close(REFERENCE.silu_and_mul(g.float()).double(), want, atol=1e-6, rtol=1e-5)
    a, m, b = torch.randn(4, 7), torch.randn(5, 7), torch.randn(5)
    torch.testing.assert_close(REFERENCE.linear(a, REFERENCE.pack_linear(m, b)), a @ m.T + b)


def test_reference_rotation_is_the_block_hadamard_product_and_its_own_inverse() -> None:
    """The oracle of ``rotate_heads``, in float64 from the matrix's entries: blocks of 16 at ``D = 80``, ``H_b`` in
    natural order (entry ``(i, j)`` is ``(-1) ** popcount(i & j)``) over ``sqrt(b)``; twice gives ``x`` back."""
    for d, b in ((64, 64), (80, 16), (96, 32)):
        x = torch.randn(3, 2, d, dtype=torch.float64)
        i = torch.arange(b)
        parity = torch.zeros(b, b, dtype=torch.int64)
        for k in range(7):
            parity ^= ((i[:, None] & i[None, :]) >> k) & 1
        h = (1 - 2 * parity).double() / b**0.5
        want = (x.reshape(3, 2, d // b, b) @ h).reshape(3, 2, d)
        got = REFERENCE.rotate_heads(x.float())
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(REFERENCE.rotate_heads(got).double(), x, atol=1e-5, rtol=1e-5)


def test_head_major_view_holds_the_values_and_nan_around_them() -> None:
    x = torch.randn(3, 2, 4)
    v = head_major_view(x)
    assert torch.equal(v, x) and v.stride() == (4, 16, 1) and v._base is not None and v._base.isnan().sum() == 2 * 4


def test_views_hold_the_values_and_nan_around_them() -> None:
    x = torch.randn(3, 5)
    v = column_view(x)
    assert not v.is_contiguous() and torch.equal(v, x) and v._base is not None and v._base.isnan().sum() == 3 * 8
    t = transposed_view(x)
    assert t.stride() == (1, 3) and torch.equal(t, x)
    q, k = qkv_views(torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.Generator().manual_seed(0))
    assert q._base is k._base and q.stride(0) == (4 + 2 * 2) * 8 + 5


def test_untouched_sees_writes_outside_the_view() -> None:
    v = column_view(torch.randn(3, 5))
    guard = Untouched({"x": v})
    guard.check("nothing")
    assert v._base is not None
    v._base[0, -1] = 1.0  # a pad column, not part of the view
    with pytest.raises(AssertionError, match="modified its input x in place"):
        guard.check("op")
