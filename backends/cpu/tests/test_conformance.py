"""paged-conformance --quick against the cpu backend, as CI runs it, checked through its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def test_conformance_quick_passes(tmp_path: Path) -> None:
    report_path, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    proc = subprocess.run(
        [str(BIN / "paged-conformance"), "run", "--backend", "cpu", "--quick",
         "--json", str(report_path), "--junitxml", str(junit)],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
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
    ):
        assert caps[row]["declared"] and caps[row]["status"] == "pass", (row, caps[row])
    assert caps["sliding_window"]["status"] == caps["soft_cap"]["status"] == caps["graph"]["status"] == "n/a"
    assert report["summary"].get("failed", 0) == 0 and report["summary"]["passed"] > 90
    assert junit.is_file()
