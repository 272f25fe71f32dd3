"""The packed-weight linear checks: the reference and a correct kernel pass; each planted bug fails where it should.

Fakes are in ``linear_fakes``. Every nested run selects the section only
(``-k linear_format``), float32 unless said otherwise.
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.grid import (
    LINEAR_FORMAT_TOKENS,
    LINEAR_FORMATS,
    linear_fallback_weights,
    linear_format_cases,
    linear_weights,
)
from paged_conformance.linear_formats import (
    assert_bytes_unchanged,
    assert_within,
    fresh,
    pristine,
    strided_x,
    tolerance,
)
from paged_conformance.results import declared_rows
from paged_core.api import LINEAR_FORMATS as FORMATS
from paged_core.api import BackendCapabilities
from paged_core.testing import random_packed, reference_linear

SECTION = "linear_format"
OWN = ["q4_0", "q4_1", "q8_0", "q4_k", "int8"]
"""What ``linear_fakes.KernelOps`` declares (``q6_k`` goes the reference's way)."""


def _failed(report: dict) -> set[str]:
    """``test[param]`` of every failed or errored test."""
    return {t["nodeid"].split("::")[-1] for t in report["tests"] if t["outcome"] in ("failed", "error")}


def _messages(report: dict) -> list[str]:
    return [t["message"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _statuses(report: dict) -> dict[str, str]:
    return {n: r["status"] for n, r in report["capabilities"].items() if n.startswith("linear_format:")}


def _rows(fail: set[str] = frozenset(), na: set[str] = frozenset(), fallback: str = "pass") -> dict[str, str]:
    rows = {f"linear_format:{f}": "fail" if f in fail else "n/a" if f in na else "pass" for f in LINEAR_FORMATS}
    return {**rows, "linear_format:fallback": fallback}


def test_reference_backend_runs_every_format(run_suite) -> None:
    code, report = run_suite("reference", "-k", SECTION)
    assert code == 0, _messages(report)
    assert _statuses(report) == _rows(fallback="n/a")
    assert report["backend"]["fused_ops"]["linear_formats"] == list(LINEAR_FORMATS)
    for f in LINEAR_FORMATS:  # quick: the first two declared dtypes
        assert report["capabilities"][f"linear_format:{f}"]["counts"]["passed"] == 2
    fallback = report["capabilities"]["linear_format:fallback"]
    assert not fallback["declared"] and fallback["counts"]["n/a"] == 2 * len(LINEAR_FORMATS)
    assert report["capabilities"]["capability_check"]["status"] == "pass"
    section = report["grid"]["linear_formats"]
    assert set(section["formats"]) == set(LINEAR_FORMATS) and section["layouts"] == ["contiguous", "columns", "rows"]


def test_a_correct_kernel_of_its_own_passes(run_suite) -> None:
    """Own unpacking for five formats, summed in float64 (more exactly than the oracle), q6_k through super()."""
    code, report = run_suite("linear_fakes:Kernel", "-k", SECTION)
    assert code == 0, _messages(report)
    assert _statuses(report) == _rows(na={"q6_k"})
    caps = report["capabilities"]
    assert not caps["linear_format:q6_k"]["declared"] and caps["linear_format:q4_k"]["declared"]
    assert caps["linear_format:fallback"]["declared"]
    assert caps["linear_format:fallback"]["counts"]["passed"] == 1  # q6_k
    info = report["backend"]["fused_ops"]
    assert info["linear_formats"] == OWN and info["overrides"] == ["pack_linear", "linear"]


def test_a_correct_kernel_passes_half_dtypes(run_suite) -> None:
    """Half outputs: two correct roundings of nearly equal sums can differ by one ulp; the bound allows exactly that
    (with half an ulp, 2**-8 for bfloat16, this kernel fails at M = 512 on the full grid)."""
    code, report = run_suite("linear_fakes:KernelHalf", "-k", SECTION)
    assert code == 0, _messages(report)
    ran = [t for t in report["tests"] if t["outcome"] == "passed" and "[" in t["nodeid"]]
    assert len(ran) == 2 * (len(OWN) + 1)  # five own formats and q6_k's fallback, at bfloat16 and float16


# fake, the tests that must fail (float32), a fragment of every failure message
BUGS = [
    ("NibbleOrder", {"test_linear_format[q4_0-float32]", "test_linear_format[q4_1-float32]"}, "mismatch"),
    ("IgnoresQ41Min", {"test_linear_format[q4_1-float32]"}, "q4_1 weight [192, 576] + bias) mismatch"),
    ("PackedIgnoresBias", {f"test_linear_format[{f}-float32]" for f in OWN}, "+ bias) mismatch"),
    ("ContiguousX", {f"test_linear_format[{f}-float32]" for f in OWN}, "column slice"),
    (
        "RepacksInPlace",
        {"test_linear_format[q4_0-float32]"},
        "pack_linear(q4_0 weight [192, 576] + bias) modified the packed weight it was given",
    ),
    ("RefusesReferencePacked", {"test_linear_format_fallback[q6_k-float32]"}, "reference-packed q6_k weight"),
    # Declares nothing (the contract gives a dense-only port no formats), so every format reaches it reference-
    # packed, and its linear, which never hands those to super(), fails each fallback.
    ("DenseOnly", {f"test_linear_format_fallback[{f}-float32]" for f in LINEAR_FORMATS}, "raised TypeError"),
]


@pytest.mark.parametrize(("fake", "tests", "fragment"), BUGS, ids=[b[0] for b in BUGS])
def test_planted_bug_fails_its_check_only(run_suite, fake: str, tests: set[str], fragment: str) -> None:
    code, report = run_suite(f"linear_fakes:{fake}", "-k", SECTION)
    assert code != 0
    assert _failed(report) == tests, _failed(report)
    assert all(fragment in m for m in _messages(report)), _messages(report)
    failing_formats = {t.split("[")[1].split("-")[0] for t in tests if t.startswith("test_linear_format[")}
    declared = set() if fake == "DenseOnly" else set(OWN)
    fallback = "fail" if "Refuses" in fake or fake == "DenseOnly" else "pass"
    assert _statuses(report) == _rows(failing_formats, set(LINEAR_FORMATS) - declared, fallback)


def test_a_misspelled_format_fails_the_declaration_check(run_suite) -> None:
    code, report = run_suite("linear_fakes:MisspelledFormat", "-k", SECTION)
    assert code != 0
    assert _failed(report) == {"test_linear_formats_declaration"}
    assert "names unknown formats ['Q4_0']" in _messages(report)[0]
    assert _statuses(report) == _rows(na=set(LINEAR_FORMATS) - {"q8_0"})  # q4_0 went the reference's way
    assert report["capabilities"]["capability_check"]["status"] == "fail"
    assert report["backend"]["fused_ops"]["linear_formats"] == ["q8_0", "Q4_0"]


def test_int8_activations_pass_when_declared(run_suite) -> None:
    """A kernel rounding activations to int8 per block passes for the formats it declares doing so for."""
    code, report = run_suite("linear_fakes:Q8Kernel", "-k", SECTION)
    assert code == 0, _messages(report)
    assert report["backend"]["fused_ops"]["q8_activation_formats"] == ["q4_0", "q4_1", "q8_0"]


@pytest.mark.parametrize(
    ("fake", "tests", "fragment"),
    [
        ("UndeclaredQ8", {f"test_linear_format[{f}-float32]" for f in ("q4_0", "q4_1", "q8_0")}, "mismatch"),
        (
            "Q8PerRow",
            {f"test_linear_format[{f}-float32]" for f in ("q4_0", "q4_1", "q8_0")},
            "against exact activations and, failing too, int8-rounded ones",
        ),
        ("StrayQ8", {"test_linear_formats_declaration"}, "names ['q6_k'], which are not in its linear_formats"),
    ],
    ids=["undeclared", "one-scale-per-row", "stray-declaration"],
)
def test_int8_activations_outside_the_declared_rule_fail(run_suite, fake: str, tests: set[str], fragment: str) -> None:
    code, report = run_suite(f"linear_fakes:{fake}", "-k", SECTION)
    assert code != 0
    assert _failed(report) == tests, _failed(report)
    assert all(fragment in m for m in _messages(report)), _messages(report)


# --- the building blocks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", LINEAR_FORMATS)
def test_the_cached_oracle_is_reference_linear_bit_for_bit(fmt: str) -> None:
    w, w32 = pristine(fmt, 37, 3 * FORMATS[fmt].block_size if fmt != "int8" else 77)
    x, b = torch.randn(5, w.in_features).bfloat16(), torch.randn(37).bfloat16()
    ours = torch.nn.functional.linear(x.float(), w32, b.float()).to(x.dtype)
    assert torch.equal(ours, reference_linear(x, w, b))


def test_one_output_ulp_is_allowed_and_two_are_not() -> None:
    """Just above a power of two a bfloat16 ulp is 2**-7 relative: the unit roundoff 2**-8 alone would fail it."""
    x, w_abs = torch.zeros(1, 4), torch.zeros(3, 4)  # no sum-order allowance: only the ulp and the floor
    ref = torch.tensor([[1.0, 1.0078125, -3.0]], dtype=torch.bfloat16)
    tol = tolerance(x, w_abs, None, ref, torch.bfloat16)
    one_ulp = torch.tensor([[1.0078125, 1.0, -3.015625]], dtype=torch.bfloat16)
    assert_within(one_ulp, ref, tol, torch.bfloat16, "one ulp")
    two_ulps = torch.tensor([[1.015625, 1.0, -3.0]], dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match=r"one ulp.*1/3 elements outside"):
        assert_within(two_ulps, ref, tol, torch.bfloat16, "one ulp")
    ref32 = torch.tensor([[1.0]])
    with pytest.raises(AssertionError, match="float32"):  # float32: no ulp, 1e-6 only
        assert_within(
            ref32 + 2e-6,
            ref32,
            tolerance(torch.zeros(1, 4), w_abs[:1], None, ref32, torch.float32),
            torch.float32,
            "float32",
        )


def test_strided_views_hold_x_and_nan_around_it() -> None:
    x = torch.randn(3, 5)
    cols, rows = strided_x(x, "columns"), strided_x(x, "rows")
    assert torch.equal(cols, x) and torch.equal(rows, x) and strided_x(x, "contiguous") is x
    assert cols.stride() == (13, 1) and cols.storage_offset() == 3
    assert rows.stride() == (10, 1) and rows._base is not None and rows._base[1::2].isnan().all()


def test_changed_bytes_or_scales_are_seen() -> None:
    w, _ = pristine("int8", 4, 8)
    copy = fresh(w, torch.device("cpu"))
    assert copy.data.data_ptr() != w.data.data_ptr()
    assert_bytes_unchanged(copy, w, "nothing")
    assert copy.scale is not None
    copy.scale[2] *= 2
    with pytest.raises(AssertionError, match="1/4 elements of its scale changed"):
        assert_bytes_unchanged(copy, w, "op")
    q = random_packed(FORMATS["q4_0"], 2, 32, torch.Generator().manual_seed(0))
    moved = fresh(q, torch.device("cpu"))
    moved.data[1, 5] ^= 1
    with pytest.raises(AssertionError, match="1/36 elements of its data changed"):
        assert_bytes_unchanged(moved, q, "op")


def test_the_sweep_covers_the_brief() -> None:
    """Every K a multiple of the block; the full M sweep; N no multiple of 16; strided and bias-free calls;
    quick a subset of full; nothing at 4096 x 4096-scale cost under quick."""
    for fmt in LINEAR_FORMATS:
        block = FORMATS[fmt].block_size
        full, quick = linear_weights(fmt, "full"), linear_weights(fmt, "quick")
        for w in full + linear_fallback_weights(fmt):
            assert w.k % block == 0
        assert [m for m, layout in full[0].calls if layout == "contiguous"] == list(LINEAR_FORMAT_TOKENS)
        assert {layout for w in full for _, layout in w.calls} == {"contiguous", "columns", "rows"}
        assert any(w.n % 16 for w in quick) and any(w.k == block for w in quick)
        assert {w.bias for w in quick} == {True, False}
        assert {(w.n, w.k) for w in quick} <= {(w.n, w.k) for w in full}
        assert max(w.n * w.k for w in quick) < 2_000_000 and max(w.n * w.k for w in full) >= 4_000_000


def test_cases_and_rows_follow_the_declarations() -> None:
    caps = BackendCapabilities(dtypes=frozenset({torch.float16, torch.float32, torch.bfloat16}), block_sizes=(16,))
    quick = linear_format_cases(caps, "quick")
    assert [c.id for c in quick[:2]] == ["q4_0-float32", "q4_0-bfloat16"] and len(quick) == 2 * len(LINEAR_FORMATS)
    assert len(linear_format_cases(caps, "full")) == 3 * len(LINEAR_FORMATS)
    rows = declared_rows(caps, frozenset({"q8_0"}))
    assert rows["linear_format:q8_0"].declared and not rows["linear_format:q4_0"].declared
    assert rows["linear_format:fallback"].declared
    assert not declared_rows(caps, frozenset(LINEAR_FORMATS))["linear_format:fallback"].declared
