"""The routed-experts section: the reference and correct reimplementations pass; each planted bug fails where it should.

Fakes are in ``moe_fakes`` (float32 only). Nested runs select the section (``-k moe``) or a part of it.
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.grid import LINEAR_FORMATS, MOE_SHAPES, MoEShape, moe_packed_shapes
from paged_conformance.moe import Layer, compare, q8_oracle, router_logits, routing_of
from paged_core.api import LINEAR_FORMATS as FORMATS
from paged_core.api import FusedOps, MoERouting, PackedExperts, route_experts
from paged_core.testing import random_packed

SECTION = "moe"


def _failed(report: dict) -> set[str]:
    return {t["nodeid"].split("::")[-1] for t in report["tests"] if t["outcome"] in ("failed", "error")}


def _messages(report: dict) -> list[str]:
    return [t["message"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _row(report: dict) -> dict:
    return report["capabilities"]["fused:moe"]


def test_the_reference_backend_passes_and_reports_its_declarations(run_suite) -> None:
    code, report = run_suite("reference", "-k", SECTION)
    assert code == 0, _messages(report)
    row = _row(report)
    assert row["declared"] and row["status"] == "pass"
    # quick: two dtypes x two layouts of dense layers and of a given routing, six formats at two dtypes, the refusals
    assert row["counts"]["passed"] == 4 + 4 + 12 + 1
    info = report["backend"]["fused_ops"]
    assert info["moe_formats"] == list(LINEAR_FORMATS) and info["batch_invariant_moe"] == []
    skipped = {t["message"] for t in report["tests"] if t["outcome"] == "n/a"}
    assert "N/A: moe and experts are the reference's (grouped by expert on the host: eager only)" in skipped


def test_a_reimplementation_as_one_custom_op_passes_and_traces(run_suite) -> None:
    code, report = run_suite("moe_fakes:AllExperts", "-k", SECTION)
    assert code == 0, _messages(report)
    passed = {t["nodeid"].split("::")[-1] for t in report["tests"] if t["outcome"] == "passed"}
    assert "test_moe_traces[float32-strided]" in passed
    assert report["backend"]["fused_ops"]["overrides"] == ["moe"]
    assert report["backend"]["fused_ops"]["moe_formats"] == []


# fake, the dense tests that must fail, a fragment of every failure message
DENSE_BUGS = [
    ("NoRenormalize", {"test_moe_dense[float32]", "test_moe_dense[float32-strided]"}, "mixtral"),
    ("TopkTies", {"test_moe_dense[float32]", "test_moe_dense[float32-strided]"}, "ties routing"),
    ("SwappedGateUp", {"test_moe_dense[float32]", "test_moe_dense[float32-strided]"}, "mismatch"),
    ("WritesX", {"test_moe_dense[float32]", "test_moe_dense[float32-strided]"}, "modified its input x in place"),
]


@pytest.mark.parametrize(("fake", "tests", "fragment"), DENSE_BUGS, ids=[b[0] for b in DENSE_BUGS])
def test_a_planted_bug_fails_the_dense_layers(run_suite, fake: str, tests: set[str], fragment: str) -> None:
    code, report = run_suite(f"moe_fakes:{fake}", "-k", "moe_dense")
    assert code != 0
    assert _failed(report) == tests
    assert all(fragment in m for m in _messages(report)), _messages(report)
    assert _row(report)["status"] == "fail"


def test_an_experts_op_assuming_normalised_weights_fails_the_given_routing(run_suite) -> None:
    code, report = run_suite("moe_fakes:ExpertsNormalises", "-k", "experts_given")
    assert code != 0
    assert _failed(report) == {"test_experts_given_routing[float32]", "test_experts_given_routing[float32-strided]"}
    assert all("a given routing" in m and "mismatch" in m for m in _messages(report)), _messages(report)


def test_own_q8_experts_pass_and_split_halves_fail_that_format_only(run_suite) -> None:
    code, report = run_suite("moe_fakes:OwnQ8", "-k", "moe_packed or moe_traces")
    assert code == 0, _messages(report)
    code, report = run_suite("moe_fakes:SplitHalves", "-k", "moe_packed")
    assert code != 0
    assert _failed(report) == {"test_moe_packed[q8_0-float32]"}
    assert "q8_0 experts E=8 k=2 H=64 I=96 mixtral" in _messages(report)[0]


def test_experts_the_reference_packed_must_go_to_super(run_suite) -> None:
    code, report = run_suite("moe_fakes:TrustsPacked", "-k", "moe_packed")
    assert code != 0
    want = {f"test_moe_packed[{f}-float32]" for f in LINEAR_FORMATS if f != "q8_0"}
    assert _failed(report) == want, _failed(report)
    assert all("TypeError" in m or "cannot unpack" in m for m in _messages(report)), _messages(report)


def test_a_host_read_fails_the_trace_only(run_suite) -> None:
    code, report = run_suite("moe_fakes:HostSync", "-k", SECTION)
    assert code != 0
    assert _failed(report) == {"test_moe_traces[float32-strided]"}
    assert "reads tensors on the host (__float__)" in _messages(report)[0]


def test_misnamed_declarations_fail_the_declaration_check(run_suite) -> None:
    code, report = run_suite("moe_fakes:Misnamed", "-k", "moe_declaration")
    assert code != 0
    assert "moe_formats names unknown ['Q8_0']" in _messages(report)[0]


def test_batch_invariance_row_by_row_passes_and_a_rounding_by_size_fails(run_suite) -> None:
    select = "moe_batch_invariant and (dense-float32 or q8_0-float32 or q4_0-float32)"
    code, report = run_suite("moe_fakes:RowByRow", "-k", select)
    assert code == 0, _messages(report)
    outcomes = {t["nodeid"].split("::")[-1]: t["outcome"] for t in report["tests"]}
    assert outcomes == {
        "test_moe_batch_invariant[q4_0-float32]": "n/a",
        "test_moe_batch_invariant[q8_0-float32]": "passed",
        "test_moe_batch_invariant[dense-float32]": "passed",
    }
    code, report = run_suite("moe_fakes:VariantRows", "-k", "moe_batch_invariant and dense-float32")
    assert code != 0
    assert "differs from the same row alone" in _messages(report)[0]


# --- the building blocks -----------------------------------------------------------------------------------------


def test_the_grid_covers_the_promised_axes() -> None:
    assert {s.experts for s in MOE_SHAPES} == {4, 8, 60} and {s.top_k for s in MOE_SHAPES} == {1, 2, 4, 8}
    assert any(s.hidden % 2 and s.intermediate % 2 for s in MOE_SHAPES)
    assert {s.routing for s in MOE_SHAPES} == {"mixtral", "qwen3", "sigmoid", "gelu"}
    for fmt, block in (("q4_k", 256), ("q8_0", 32), ("int8", 1)):
        assert all(s.hidden % block == 0 and s.intermediate % block == 0 for s in moe_packed_shapes(fmt))
    assert moe_packed_shapes("q4_k")[-1].down_format == "q6_k"


def test_router_logits_make_their_distributions() -> None:
    gen = torch.Generator().manual_seed(0)
    r = MoERouting(60, 4, renormalize=False)
    few = route_experts(router_logits(gen, 130, 60, 4, "few_experts"), r)[1]
    assert len(torch.unique(few)) == 5
    one = route_experts(router_logits(gen, 130, 60, 4, "one_expert"), r)[1]
    assert (one[:, 0] == 30).all()
    ties = router_logits(gen, 7, 60, 4, "ties")
    assert set(torch.unique(ties).tolist()) == {-1.0, 0.0, 1.0}
    rand = router_logits(gen, 7, 60, 4, "random").sort(-1).values
    assert float((rand[:, 1:] - rand[:, :-1]).min()) >= 0.05


def test_the_q8_oracle_accepts_q8_rounding_and_nothing_else() -> None:
    """A kernel rounding both products' inputs to q8 fails the exact tolerance and fits the q8 one; with a wrong
    routing weight it fits neither."""
    shape = MoEShape(8, 2, 64, 96, "mixtral")
    gen = torch.Generator().manual_seed(1)
    gate_up = random_packed(FORMATS["q4_0"], 8 * 192, 64, gen, scale=0.125)
    down = random_packed(FORMATS["q4_0"], 8 * 64, 96, gen, scale=96**-0.5)
    experts = PackedExperts(gate_up, down)
    routing = routing_of(shape)
    x = torch.randn(33, 64, generator=gen)
    logits = router_logits(gen, 33, 8, 2, "random")
    want = FusedOps().moe(x, logits, experts, routing)
    weights, ids = route_experts(logits, routing)
    rounded = q8_oracle(x, weights, ids, experts, routing.activation, (True, True))
    plain = Layer(experts, experts, routing, "q4_0")
    with pytest.raises(AssertionError, match="mismatch"):
        compare(rounded, want, plain, x, weights, ids, torch.float32, "rounded")
    allowed = Layer(experts, experts, routing, "q4_0", (True, True))
    compare(rounded, want, allowed, x, weights, ids, torch.float32, "rounded")
    with pytest.raises(AssertionError, match="nor does it fit the q8 rounding"):
        compare(rounded * 1.1, want, allowed, x, weights, ids, torch.float32, "scaled")
