"""paged-conformance against the cpu backend on a slice of the quick grid, checked through its JSON report.

The CLI, the plugin's loading and the report's capability rows, on one case per declared row; ci/cpu runs the
whole grid once (its report is ``reports/conformance-cpu.json``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
SELECTION = (
    "float32-h80-b16-gqa4-mixed-block+1 or bfloat16-h128-b128-gqa4-decode-1 or long_context or kvcache_float16 "
    "or block+1-fused or copy_blocks or padding or strided or undeclared or test_sliding_window or test_soft_cap "
    "or kvcache_int8 or kvcache_float8_e4m3fn or kvcache_float8_e5m2"
)


def test_conformance_slice_passes_and_reports_its_rows(tmp_path: Path) -> None:
    report_path, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            str(BIN / "paged-conformance"),
            "run",
            "--backend",
            "cpu",
            "--quick",
            "--json",
            str(report_path),
            "--junitxml",
            str(junit),
            "--",
            "-k",
            SELECTION,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["backend"]["distribution"] == "paged-backend-cpu"
    caps = report["capabilities"]
    for row in (
        "dtype:float32",
        "dtype:bfloat16",
        "kv_dtype:float16",
        "batch:long_context",
        "block_size:16",
        "block_size:128",
        "head_size:80",
        "copy_blocks",
        "padding",
        "strided_inputs",
        "kv_dtype:int8",
        "kv_dtype:float8_e4m3fn",
        "kv_dtype:float8_e5m2",
    ):
        assert caps[row]["declared"] and caps[row]["status"] == "pass", (row, caps[row])
    assert caps["sliding_window"]["status"] == caps["soft_cap"]["status"] == "pass"
    assert caps["graph"]["status"] == "n/a"
    assert report["summary"].get("failed", 0) == 0 and report["summary"]["passed"] > 20
    assert junit.is_file()
