"""``paged bench serve`` for real: it starts ``paged serve`` (embedded SmolLM2), streams 4 requests, stops the server.

About a minute, nearly all of it the server's start-up (imports and loading the model).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from paged_bench.serve_report import validate_serve_report
from paged_bench.serve_run import healthy
from paged_core.cli.main import main


@pytest.mark.slow
def test_bench_serve_tiny_run_writes_a_complete_report(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    rc = main(
        [
            "bench",
            "serve",
            "--servers",
            "mp",
            "--num-requests",
            "4",
            "--max-tokens",
            "4",
            "--concurrency",
            "2",
            "--warmup-requests",
            "1",
            "--kv-cache-memory",
            "64MiB",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert validate_serve_report(report) == []
    assert report["config"]["baseline"] == "mp" and report["config"]["concurrency"] == 2
    assert report["config"]["engine_flags"] == ["--kv-cache-memory", "64MiB"]
    assert report["machine"]["cpu_model"] and report["workload_stats"]["num_requests"] == 4
    assert report["ratios"] == {}  # one variant: nothing to compare with
    (run,) = report["runs"]
    assert run["name"] == "mp" and run["model"] and (run["completed"], run["failed"]) == (4, 0)
    assert run["output_tokens"] == run["expected_output_tokens"] == 16  # EOS ignored: exactly what was asked
    assert run["token_count_source"] == "usage"
    assert run["prompt_tokens"] == report["workload_stats"]["prompt_tokens"]
    for key in ("seconds", "output_tok_s", "total_tok_s", "requests_per_s"):
        assert run[key] > 0, key
    assert run["server"]["startup_s"] > 0
    assert len(run["ttft_s"]["values"]) == 4 and run["ttft_s"]["p50"] > 0
    for key in ("itl_s", "tpot_s", "latency_s"):
        assert run[key]["p50"] > 0 and run[key]["p99"] >= run[key]["p50"], key
    assert run["itl_s"]["count"] >= 4  # up to 3 gaps per 4-token stream
    assert not healthy(run["server"]["url"])  # the server was stopped
