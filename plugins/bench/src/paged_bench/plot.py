"""``--plot FILE.png``: one figure per workload, drawn from the report itself (Agg, no display needed).

Model workloads get output tok/s bars for every system; ``kv-util`` adds
KV utilisation and running requests over time for both allocators; ``prefix``
adds the TTFT distribution (an empirical CDF) with caching on and off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _bars(ax: Any, report: dict[str, Any]) -> None:
    runs = report["runs"]
    names = [r["name"] for r in runs]
    values = [r["output_tok_s"] for r in runs]
    colors = ["tab:blue" if n == "paged" else "tab:gray" for n in names]
    bars = ax.bar(names, values, color=colors)
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=8)
    roof = report.get("roofline")
    if roof is not None and roof["kind"] == "flops":
        ax.axhline(roof["bound_output_tok_s"], color="tab:red", linestyle="--", label="GEMM roofline")
        ax.legend(fontsize=8)
    elif roof is not None and roof["kind"] == "bandwidth":
        ax.axhline(roof["bound_tok_s"], color="tab:red", linestyle="--", label="weight-bandwidth bound (decode)")
        ax.legend(fontsize=8)
    ax.set_ylabel("output tokens / s")
    n = report["workload_stats"]["num_requests"]
    ax.set_title(f"{report['workload']}: output throughput ({n} request{'s' if n != 1 else ''})")
    ax.tick_params(axis="x", labelrotation=15)


def _kv_util(axes: Any, report: dict[str, Any]) -> None:
    kv = report["kv_util"]
    top, bottom = axes
    for key, color in (("paged", "tab:blue"), ("reserved", "tab:gray")):
        trace = kv[key]
        label = f"{trace['name']} (mean {trace['utilization']:.0%}, peak {trace['peak_concurrent']} requests)"
        top.plot(trace["series"]["step"], trace["series"]["utilization"], color=color, label=label, linewidth=1)
        bottom.plot(trace["series"]["step"], trace["series"]["running"], color=color, linewidth=1)
    top.set_ylim(0, 1.05)
    top.set_ylabel("allocated KV slots holding tokens")
    top.set_title("kv-util: KV utilization over time, same budget")
    top.legend(fontsize=8, loc="lower right")
    bottom.set_ylabel("running requests")
    bottom.set_xlabel("scheduler step")


def _ttft(ax: Any, report: dict[str, Any]) -> None:
    for run in report["runs"]:
        ttft = run["ttft_s"]
        if ttft is None:
            continue
        values = sorted(ttft["values"])
        share = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, share, where="post", label=f"{run['name']} (p50 {ttft['p50'] * 1e3:.0f} ms)")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of requests")
    ax.set_title("prefix: TTFT distribution")
    ax.legend(fontsize=8, loc="lower right")


def write_plot(report: dict[str, Any], path: str | Path) -> Path:
    """Draw the workload's figure from ``report`` and save it as a PNG at ``path``."""
    from matplotlib.figure import Figure

    path = Path(path)
    workload = report["workload"]
    if workload == "kv-util":
        fig = Figure(figsize=(9, 6), layout="constrained")
        _kv_util(fig.subplots(2, 1, sharex=True), report)
    elif workload == "prefix":
        fig = Figure(figsize=(12, 4.5), layout="constrained")
        left, right = fig.subplots(1, 2)
        _bars(left, report)
        _ttft(right, report)
    else:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        _bars(fig.subplots(), report)
    fig.savefig(path, dpi=110)
    return path
