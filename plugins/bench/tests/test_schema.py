"""The report validator catches what the README's schema forbids."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from paged_bench.kv_util import KVUtilConfig, run_kv_util
from paged_bench.machine import machine_info
from paged_bench.options import BenchOptions
from paged_bench.report import build_report, kv_util_figures
from paged_bench.result import RunResult
from paged_bench.schema import validate, validate_report
from paged_bench.workloads import kv_util, throughput


@pytest.fixture(scope="module")
def kv_report() -> dict[str, Any]:
    reqs = kv_util(20, max_len=256)
    cfg = KVUtilConfig(kv_tokens=1024, max_len=256)
    opts = BenchOptions("kv-util", kv_util=cfg, progress=False)
    return build_report(
        config=opts.to_dict(),
        machine=machine_info(torch.device("cpu")),
        requests=reqs,
        kv_util=kv_util_figures(*run_kv_util(reqs, cfg)),
        argv=["paged"],
    )


def model_report() -> dict[str, Any]:
    reqs = throughput(2)
    runs = [RunResult("paged", 1.0, 2, 10, 4, ttft=[0.1, 0.2], steps=3), RunResult("hf-static", 2.0, 2, 10, 4)]
    roof = {"kind": "flops", "fraction": 0.1, "peak_flops_per_s": 10.0, "achieved_flops_per_s": 1.0}
    return build_report(
        config=BenchOptions("throughput").to_dict(),
        machine=machine_info(torch.device("cpu")),
        requests=reqs,
        runs=runs,
        roofline=roof,
        argv=["paged"],
    )


def test_built_reports_are_valid(kv_report: dict[str, Any]) -> None:
    assert validate_report(kv_report) == []
    assert validate_report(model_report()) == []


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("machine"), "$: missing 'machine'"),
        (lambda r: r["runs"][0].update(seconds="1"), "$.runs[0].seconds: expected number"),
        (lambda r: r["runs"][0].update(steps=True), "$.runs[0].steps: expected integer or null"),
        (lambda r: r["runs"][0].update(output_tok_s=-1.0), "below the minimum"),
        (lambda r: r.update(workload="fast"), "'fast' is not one of"),
        (lambda r: r["ratios"].update(x="big"), "$.ratios.x: expected number"),
        (lambda r: r["roofline"].pop("achieved_flops_per_s"), "flops roofline lacks 'achieved_flops_per_s'"),
        (lambda r: r.update(runs=[]), "must report at least our own run"),
        # A run's own roofline (llama.cpp's) is checked like the report's.
        (
            lambda r: r["runs"][1].update(roofline={"kind": "bandwidth", "fraction": 0.2, "peak_bytes_per_s": 1.0}),
            "$.runs[1].roofline: bandwidth roofline lacks 'achieved_bytes_per_s'",
        ),
        (lambda r: r["runs"][1].update(roofline={"kind": "bytes", "fraction": 0.2}), "'bytes' is not one of"),
        (lambda r: r["runs"][1].update(llama_cpp=[]), "$.runs[1].llama_cpp: expected object or null"),
    ],
)
def test_broken_reports_are_caught(mutate: Any, message: str) -> None:
    report = copy.deepcopy(model_report())
    mutate(report)
    errors = validate_report(report)
    assert any(message in e for e in errors), errors


def test_kv_util_report_needs_its_traces(kv_report: dict[str, Any]) -> None:
    broken = copy.deepcopy(kv_report)
    broken["kv_util"] = None
    assert "kv-util workload must report its traces" in " ".join(validate_report(broken))
    broken = copy.deepcopy(kv_report)
    del broken["kv_util"]["paged"]["series"]["running"]
    assert validate_report(broken) == ["$.kv_util.paged.series: missing 'running'"]


def test_validator_types() -> None:
    assert validate(1, {"type": "number"}) == []
    assert validate(True, {"type": "number"}) != []
    assert validate(None, {"type": ["string", "null"]}) == []
    assert validate({"a": 1}, {"type": "object", "additionalProperties": {"type": "string"}}) != []
