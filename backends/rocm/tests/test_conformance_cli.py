"""The conformance command in interpreter mode (``--device cpu-interpret``) on a small slice of the grid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# A slice that stays quick in the interpreter; the CI run covers the whole quick grid.
SELECTION = (
    "test_attention and (float32-h64-b16-gqa8-mixed-block+1 or fused) or test_write_kv or test_copy_blocks "
    "or test_graph_step"
)


def test_conformance_slice_passes_in_interpreter(tmp_path: Path) -> None:
    """The suite's CLI loads the backend in interpreter mode, runs the slice, and reports it passing."""
    report = tmp_path / "rocm.json"
    cli = shutil.which("paged-conformance", path=str(Path(sys.executable).parent))
    assert cli is not None, "paged-conformance is not installed next to this python"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PAGED_ROCM_INTERPRET")}
    proc = subprocess.run(
        [
            cli,
            "run",
            "--backend",
            "rocm",
            "--device",
            "cpu-interpret",
            "--quick",
            "--json",
            str(report),
            "--",
            "-q",
            "-k",
            SELECTION,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), f"no JSON report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(report.read_text())
    outcomes = {t["nodeid"].split("::")[-1]: t["outcome"] for t in data["tests"]}
    bad = {name: o for name, o in outcomes.items() if o != "passed"}
    assert proc.returncode == 0 and not bad, f"not passing: {bad}\n{proc.stdout[-3000:]}"
    assert data["backend"]["name"] == "rocm" and data["backend"]["device"] == "cpu"
    assert data["backend"]["capabilities"]["graph_support"] == "any"
    ran = " ".join(outcomes)
    for needle in ("gqa8-mixed", "fused", "test_write_kv", "test_copy_blocks", "test_graph_step_has_no_host_reads"):
        assert needle in ran, f"{needle} did not run: {sorted(outcomes)}"
