"""Runs ``interpreted/interp_*.py`` (kernels vs the reference backend) in a child process under the interpreter.

Triton fixes interpreter vs compiled mode when it is first imported, so these kernel checks cannot share
the workspace's test process; the child's JUnit report is parsed so that every inner failure, error or
skip shows up here by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_interpreted_kernel_checks(tmp_path: Path) -> None:
    """Every interpreted check passes, and none is skipped."""
    report = tmp_path / "junit.xml"
    # The checks choose device tiles per family (PAGED_TRITON_INTERPRET_TILES): the interpreter then runs the
    # exact tile shapes a GPU launch uses.
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(HERE / "interpreted"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "python_files=interp_*.py",
            "--rootdir",
            str(HERE / "interpreted"),
            "-c",
            os.devnull,
            f"--junitxml={report}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), f"the child run wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    cases = suite.findall("testcase")
    bad = [c.get("name") for c in cases if any(child.tag in ("failure", "error", "skipped") for child in c)]
    assert proc.returncode == 0 and not bad, f"interpreted checks failed or skipped: {bad}\n{proc.stdout[-4000:]}"
    assert len(cases) >= 30, f"expected every interpreted check to run, got {len(cases)}"
