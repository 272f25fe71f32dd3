"""The pytest11 plugin does nothing in ordinary pytest runs, and the grid is built from declarations only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from paged_conformance.grid import attention_cases, graph_batch_sizes, graph_capture_sizes, length_value
from paged_core.api import BackendCapabilities


def test_plugin_is_inert_without_a_backend(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    (tmp_path / "test_fixture.py").write_text("def test_needs_suite(conformance):\n    pass\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "paged_conformance.plugin",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
            "-q",
            "--rootdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert "1 passed" in out and "1 error" in out, out
    assert "paged-conformance:" not in out, "the summary table must only appear in conformance runs"
    assert "needs --paged-backend" in out


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, paged_conformance.plugin; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_grid_only_generates_declared_configs_with_readable_ids() -> None:
    caps = BackendCapabilities(
        dtypes=frozenset({torch.bfloat16}), block_sizes=(32,), head_sizes=frozenset({80}), gqa_ratios=frozenset({1})
    )
    cases = attention_cases(caps, "full")
    assert cases and {(c.dtype, c.head_size, c.block_size, c.gqa) for c in cases} == {(torch.bfloat16, 80, 32, 1)}
    ids = [c.id for c in cases]
    assert "bfloat16-h80-b32-gqa1-decode-block-1" in ids and len(ids) == len(set(ids))
    assert not any(i.endswith("prefill-1") for i in ids), "a one-token prefill is a decode"
    assert len(attention_cases(caps, "quick")) < len(cases) or len(cases) <= 20


def test_length_labels_and_graph_sizes() -> None:
    assert [length_value(x, 16) for x in ("1", "block-1", "block", "block+1", "long")] == [1, 15, 16, 17, 51]
    assert set(graph_capture_sizes("quick")) < set(graph_batch_sizes("quick")), "some batches must be padded"
