"""Run figures, ratios between systems, and the goal table."""

from __future__ import annotations

import pytest

from paged_bench.report import goals, ratios
from paged_bench.result import RunResult, percentile, summarize


def test_percentile_interpolates() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert summarize([1.0, 3.0])["mean"] == 2.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_run_rates() -> None:
    r = RunResult("paged", seconds=2.0, num_requests=2, prompt_tokens=10, output_tokens=30)
    assert (r.output_tok_s, r.total_tok_s) == (15.0, 20.0)
    assert r.to_dict()["ttft_s"] is None
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        RunResult("x", 0.0, 1, 1, 1)


def test_ratios_compare_ours_with_each_system() -> None:
    ours = RunResult("paged", 1.0, 2, 100, 40, ttft=[0.1, 0.3], prefill_tokens_computed=20)
    off = RunResult("paged-no-prefix-cache", 2.0, 2, 100, 40, ttft=[0.5, 1.5], prefill_tokens_computed=100)
    hf = RunResult("hf-static", 4.0, 2, 100, 40)
    got = ratios([ours, off, hf])
    assert got["paged_vs_hf-static"] == 4.0
    assert got["paged_vs_paged-no-prefix-cache"] == 2.0
    assert got["prefill_reduction"] == pytest.approx(0.8)
    assert got["ttft_p50_speedup"] == pytest.approx(1.0 / 0.2)


def test_goals_report_missing_figures_as_unmeasured() -> None:
    g = goals("throughput", {"paged_vs_hf-static": 3.5, "roofline_fraction": 0.2})
    by = {x["figure"]: x for x in g}
    assert by["paged_vs_hf-static"]["met"] is True
    assert by["roofline_fraction"]["met"] is False
    assert by["paged_vs_hf-cb"]["value"] is None and by["paged_vs_hf-cb"]["met"] is None
    assert goals("long", {}) == []
