"""The example backend, tested the way a third party's would be: registered, then run through paged-conformance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from paged_backend_example import ExampleBackend
from paged_backend_example.kernels import paged_attention
from paged_core.api import AttentionSpec, build_attention_metadata
from paged_core.testing import load_registry

BIN = Path(sys.executable).parent
# One case per row the test reads; ci/cpu runs the example's whole grid once (reports/conformance-example.json).
SELECTION = "float32-h128-b16-gqa4-mixed-block+1 or test_graph or undeclared or test_sliding_window or test_soft_cap"


def test_registered_through_the_entry_point() -> None:
    registry = load_registry(refresh=True)
    assert registry.get("example") is ExampleBackend
    record = next(r for r in registry.records() if r.name == "example")
    assert record.distribution == "paged-backend-example"
    assert ExampleBackend.priority == 10


def test_decode_path_traces_without_host_sync() -> None:
    """``fullgraph=True`` refuses any graph break, so an ``.item()`` in the decode path would fail here."""
    cache = torch.randn(2, 6, 16, 2, 64)
    md = build_attention_metadata([1, 1], [17, 5], [[3, 1], [4]], 16, max_blocks_per_seq=2)
    query = torch.randn(2, 8, 64)

    def decode(q, kv, qsl, lens, table):
        return paged_attention(q, kv, qsl, lens, table, 1, 0.125)

    args = (query, cache, md.query_start_loc, md.seq_lens, md.block_table)
    compiled = torch.compile(decode, backend="eager", fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(*args), decode(*args))


def test_conformance_suite_passes(tmp_path: Path) -> None:
    report_path, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            str(BIN / "paged-conformance"),
            "run",
            "--backend",
            "example",
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
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["backend"]["distribution"] == "paged-backend-example"
    caps = report["capabilities"]
    assert caps["sliding_window"]["status"] == caps["soft_cap"]["status"] == "n/a"
    assert caps["graph"]["declared"] and caps["graph"]["status"] == "pass"
    assert caps["dtype:float16"] == {"declared": False, "status": "n/a", "counts": caps["dtype:float16"]["counts"]}
    assert report["summary"].get("failed", 0) == 0 and report["summary"]["passed"] > 5
    assert "paged-conformance: example on cpu" in proc.stdout and junit.is_file()


def test_strided_views_give_the_same_result_as_contiguous_inputs() -> None:
    """q/k/v as slices of one fused projection (the contract allows views) need no copy and change nothing."""
    backend = ExampleBackend("cpu")
    spec = AttentionSpec(8, 2, 64)
    md = build_attention_metadata([1, 3], [5, 3], [[1], [2]], 16)
    fused = torch.randn(4, (8 + 2 + 2) * 64 + 8)
    q, k, v = fused[:, :512].view(4, 8, 64), fused[:, 512:640].view(4, 2, 64), fused[:, 640:768].view(4, 2, 64)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    outs = []
    for args in ((q, k, v), (q.contiguous(), k.contiguous(), v.contiguous())):
        cache = backend.allocate_kv_cache(4, 16, spec, torch.float32)
        outs.append(backend.forward(*args, cache, md, spec))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
