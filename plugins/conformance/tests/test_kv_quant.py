"""Quantized KV caches in the suite: correct fakes pass, each broken one fails where its bug is, undeclared is N/A."""

from __future__ import annotations

import pytest
import torch

from paged_conformance.batch import make_batch
from paged_conformance.grid import QUANTIZED_KV, Case, attention_cases
from paged_conformance.harness import tolerance
from paged_conformance.oracle import dense_attention, stored_values
from paged_conformance.quantized_kv import code_mismatch, probe_vectors, value_mismatch
from paged_core.api import dequantize_kv, quantize_kv
from paged_core.reference import ReferenceBackend

KV_CHECKS = "kvcache or quantized_write"


def _failed(report: dict) -> list[str]:
    return [t["nodeid"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _rows(report: dict, *names: str) -> dict[str, str]:
    return {n: report["capabilities"][n]["status"] for n in names}


QUANT_ROWS = ("kv_dtype:int8", "kv_dtype:float8_e4m3fn", "kv_dtype:float8_e5m2")


@pytest.mark.parametrize("fake", ["QuantFake", "OwnLayoutQuant"])
def test_correct_quantized_caches_pass(run_suite, fake: str) -> None:
    code, report = run_suite(f"kv_quant_fakes:{fake}", "-k", KV_CHECKS)
    assert code == 0, _failed(report)
    assert _rows(report, *QUANT_ROWS, "kv_dtype:bfloat16") == dict.fromkeys([*QUANT_ROWS, "kv_dtype:bfloat16"], "pass")
    ran = [t["nodeid"] for t in report["tests"] if t["outcome"] == "passed"]
    assert sum("test_quantized_write_follows_the_rule[" in n for n in ran) == 3
    assert sum("kvcache_int8" in n for n in ran) >= 1  # an attention case over an int8 cache, against the reference


def test_truncating_int8_fails_its_write_check(run_suite) -> None:
    code, report = run_suite("kv_quant_fakes:RoundsTowardZero", "-k", "quantized_write")
    failed = _failed(report)
    assert code != 0 and failed == [n for n in failed if n.endswith("[int8]")] and len(failed) == 1, failed
    message = next(t["message"] for t in report["tests"] if t["outcome"] == "failed")
    assert "stored values differ from quantize_kv" in message and "keys stored in a int8 cache" in message


def test_wrong_scales_in_an_own_layout_fail_through_attention(run_suite) -> None:
    code, report = run_suite("kv_quant_fakes:WrongScale", "-k", "quantized_write")
    assert code != 0
    failed = _failed(report)
    assert len(failed) == 3, failed  # every quantized dtype, read back through attention
    messages = [t["message"] for t in report["tests"] if t["outcome"] == "failed"]
    assert all("values read from a" in m and "more than one step" in m for m in messages), messages


def test_ignoring_scales_fails_the_quantized_attention_cases_only(run_suite) -> None:
    code, report = run_suite("kv_quant_fakes:IgnoresScales", "-k", KV_CHECKS)
    failed = _failed(report)
    assert code != 0
    assert failed and all(any(q in n for q in ("kvcache_int8", "kvcache_float8", "quantized_write")) for n in failed)
    statuses = _rows(report, *QUANT_ROWS, "kv_dtype:bfloat16")
    assert statuses["kv_dtype:bfloat16"] == "pass"
    assert all(statuses[r] == "fail" for r in QUANT_ROWS), statuses


def test_undeclared_quantized_caches_are_not_applicable(run_suite) -> None:
    code, report = run_suite("GoodFake", "-k", "quantized_write")
    assert code == 0
    for row in QUANT_ROWS:
        r = report["capabilities"][row]
        assert (r["declared"], r["status"], r["counts"]["n/a"]) == (False, "n/a", 1), (row, r)


def test_the_grid_has_a_few_cases_per_quantized_dtype() -> None:
    caps = ReferenceBackend.capabilities()
    quick, full = attention_cases(caps, "quick"), attention_cases(caps, "full")
    for kv in QUANTIZED_KV:
        assert sum(c.kv_dtype == kv for c in quick) == 1
        assert 3 <= sum(c.kv_dtype == kv for c in full) <= 8
        assert any(c.kv_dtype == kv and c.kind == "long_context" for c in full)


def test_both_oracles_read_what_a_quantized_cache_holds() -> None:
    """The dense oracle quantizes the batch's keys by the rule; the reference oracle stores them in the same dtype."""
    case = Case(torch.bfloat16, 64, 16, 2, "mixed", "block+1", kv_dtype=torch.int8)
    batch = make_batch(case)
    assert torch.equal(batch.keys[0], batch.keys[0].bfloat16())  # not rounded by the batch: the cache does that
    stored = stored_values(batch)
    assert torch.equal(stored.keys[1], dequantize_kv(quantize_kv(batch.keys[1], torch.int8)))
    assert tolerance(batch) == (3e-2, 3e-2)  # the compute dtype's: both sides hold the same quantized values
    dense = dense_attention(batch)
    from paged_conformance.harness import expected

    ref = expected("reference", batch, torch.device("cpu"))
    torch.testing.assert_close(ref.float(), dense, atol=2e-2, rtol=2e-2)


def test_the_comparisons_allow_ties_and_nothing_more() -> None:
    x = probe_vectors(32, 2, 64, seed=0)
    packed = quantize_kv(x, torch.int8)
    assert code_mismatch(packed, packed, "same") is None
    nudged = packed.clone()
    nudged[0, 0, 5] = int(nudged[0, 0, 5]) + (1 if int(nudged[0, 0, 5]) < 127 else -1)
    assert code_mismatch(nudged, packed, "one tie") is None  # one step, on one element of 4,096
    far = packed.clone()
    far[3, 1, 7] = int(far[3, 1, 7]) // 2 + 3
    assert "differ from quantize_kv by more than one step" in str(code_mismatch(far, packed, "x"))
    values = dequantize_kv(packed)
    assert value_mismatch(values, packed, torch.float32, "exact") is None
    assert value_mismatch(values.bfloat16().float(), packed, torch.bfloat16, "bf16 output") is None
    assert "more than one step" in str(value_mismatch(values * 1.05, packed, torch.float32, "5% off"))
