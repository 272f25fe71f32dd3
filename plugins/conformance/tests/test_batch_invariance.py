"""The batch-invariance section: the reference passes; each batch-dependent kernel fails its row only.

Fakes are in ``invariance_fakes``: the reference backend with one part made batch-dependent the way real
kernels are, still declaring invariance. Nested runs select the section only (``-k batch_invariance``).
"""

from __future__ import annotations

import dataclasses

from paged_conformance.grid import INVARIANCE_PARTS, invariance_linear_cases
from paged_conformance.results import declared_rows
from paged_core.api import DENSE_LINEAR_KINDS, LINEAR_FORMATS, LINEAR_KINDS
from paged_core.testing import ReferenceBackend

SECTION = "batch_invariance"
ROWS = [f"{SECTION}:{p}" for p in INVARIANCE_PARTS]


def _statuses(report: dict) -> dict[str, str]:
    return {n: r["status"] for n, r in report["capabilities"].items() if n.startswith(f"{SECTION}:")}


def _messages(report: dict) -> list[str]:
    return [t["message"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _failed(report: dict) -> set[str]:
    return {t["nodeid"].split("::")[-1] for t in report["tests"] if t["outcome"] in ("failed", "error")}


def test_the_reference_backend_passes_every_part(run_suite) -> None:
    code, report = run_suite("reference", "-k", SECTION)
    assert code == 0, _messages(report)
    assert _statuses(report) == dict.fromkeys(ROWS, "pass")
    caps = report["capabilities"]
    # quick: the first two dtypes, then the first over each quantized KV cache (int8, fp8 e4m3 and e5m2)
    assert caps["batch_invariance:attention"]["counts"]["passed"] == 2 + 3
    assert caps["kv_dtype:int8"]["counts"]["passed"] == 1
    assert caps["batch_invariance:linear:q4_k"]["counts"]["passed"] == 2
    assert caps["batch_invariance:linear:float16"]["counts"]["passed"] == 1  # a dense kind at its own dtype
    assert caps["capability_check"]["status"] == "pass"
    info = report["backend"]["fused_ops"]
    assert info["batch_invariant_linear"] == list(LINEAR_KINDS) and info["batch_invariant_layer_ops"] is True
    assert report["backend"]["capabilities"]["batch_invariant"] is True
    assert report["grid"]["batch_invariance"]["rows"][-1] == 512


def test_an_undeclaring_backend_is_not_applicable(run_suite) -> None:
    code, report = run_suite("GoodFake", "-k", SECTION)
    assert code == 0, _messages(report)
    assert _statuses(report) == dict.fromkeys(ROWS, "n/a")
    assert all(not report["capabilities"][r]["declared"] for r in ROWS)
    skipped = [t["message"] for t in report["tests"] if t["outcome"] == "n/a"]
    assert "N/A: capabilities().batch_invariant is not declared" in skipped


def test_a_key_split_sized_by_the_batch_fails_attention_only(run_suite) -> None:
    code, report = run_suite("invariance_fakes:SplitByBatch", "-k", f"{SECTION} and not linear")
    assert code != 0
    assert _failed(report) == {"test_batch_invariant_attention[float32]", "test_batch_invariant_attention[bfloat16]"}
    assert _statuses(report)["batch_invariance:attention"] == "fail"
    assert _statuses(report)["batch_invariance:layer_ops"] == "pass"
    message = _messages(report)[0]
    assert "differs from the same position decoded alone" in message and "elements differ" in message


def test_a_rounding_rule_that_changes_with_the_row_count_fails_each_linear_kind(run_suite) -> None:
    code, report = run_suite("invariance_fakes:VariantLinear", "-k", "batch_invariant_linear and float32")
    assert code != 0
    assert _failed(report) == {f"test_batch_invariant_linear[{f}-float32]" for f in LINEAR_FORMATS} | {
        "test_batch_invariant_linear[dense-float32]"
    }
    message = _messages(report)[0]
    assert "differs from the same row alone" in message and "of the prefill call of all 512 rows" in message


def test_a_norm_summed_otherwise_above_eight_rows_fails_the_layer_ops_only(run_suite) -> None:
    code, report = run_suite("invariance_fakes:VariantNorm", "-k", f"{SECTION} and float32 and (layer_ops or dense)")
    assert code != 0
    assert _failed(report) == {"test_batch_invariant_layer_ops[float32]"}
    assert _statuses(report)["batch_invariance:layer_ops"] == "fail"
    assert _statuses(report)["batch_invariance:linear:float32"] == "pass"
    assert _messages(report)[0].startswith("AssertionError: rms_norm [T, 67] float32: row ")


def test_a_rotation_that_becomes_a_product_above_eight_rows_fails_the_layer_ops_only(run_suite) -> None:
    code, report = run_suite(
        "invariance_fakes:VariantRotation", "-k", f"{SECTION} and float32 and (layer_ops or dense)"
    )
    assert code != 0
    assert _failed(report) == {"test_batch_invariant_layer_ops[float32]"}
    assert _statuses(report)["batch_invariance:linear:float32"] == "pass"
    assert _messages(report)[0].startswith(
        "AssertionError: rotate_heads [T, 9, 128] (a slice of one QKV buffer) float32: row "
    )


def test_unknown_weight_kinds_fail_the_declaration(run_suite) -> None:
    code, report = run_suite("invariance_fakes:MisnamedKinds", "-k", "batch_invariance_declaration")
    assert code != 0
    assert "names unknown weight kinds ['Q4_0', 'bf16']" in _messages(report)[0]


def test_rows_are_declared_from_the_capabilities_and_the_ops() -> None:
    caps = ReferenceBackend.capabilities()
    rows = declared_rows(dataclasses.replace(caps, batch_invariant=False), frozenset(), frozenset({"q8_0"}), True)
    declared = {n for n, r in rows.items() if n.startswith(SECTION) and r.declared}
    assert declared == {"batch_invariance:layer_ops", "batch_invariance:linear:q8_0"}
    assert {n for n, r in declared_rows(caps).items() if n.startswith(SECTION) and r.declared} == {
        "batch_invariance:attention"
    }
    cases = invariance_linear_cases(caps, "full")
    assert [c.id for c in cases][-3:] == [f"dense-{k}" for k in DENSE_LINEAR_KINDS]
    assert len(cases) == 3 * len(LINEAR_FORMATS) + 3 and cases[0].shape == (192, 576)
    assert next(c for c in cases if c.kind == "q6_k").shape == (256, 2048)
