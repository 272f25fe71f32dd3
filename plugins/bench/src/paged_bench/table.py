"""The human summary printed at the end of ``paged bench``: rich tables drawn from the report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ms(summary: dict[str, Any] | None, key: str) -> str:
    return "-" if summary is None else f"{summary[key] * 1e3:.0f}"


def runs_table(report: dict[str, Any]) -> Table:
    """One row per system: time, throughput, TTFT, prefill work and our speed-up over it."""
    t = Table(title=f"paged bench {report['workload']}")
    for col in (
        "system",
        "s",
        "out tok/s",
        "all tok/s",
        "decode tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "prefill tok",
        "hit rate",
        "drafts kept",
        "paged is",
    ):
        t.add_column(col, justify="left" if col == "system" else "right")
    ratios = report["ratios"]
    for r in report["runs"]:
        ratio = ratios.get(f"paged_vs_{r['name']}")
        t.add_row(
            r["name"],
            _f(r["seconds"], "{:.2f}"),
            _f(r["output_tok_s"]),
            _f(r["total_tok_s"]),
            _f(r["decode_tok_s"]),
            _ms(r["ttft_s"], "p50"),
            _ms(r["ttft_s"], "p99"),
            _f(r["prefill_tokens_computed"], "{:d}"),
            _f(r["prefix_hit_rate"], "{:.1%}"),
            _f(r.get("spec_acceptance_rate"), "{:.1%}"),
            "-" if ratio is None else f"{ratio:.2f}x",
        )
    return t


def kv_table(report: dict[str, Any]) -> Table:
    """Both allocators of ``kv-util`` side by side."""
    t = Table(title="kv-util: same requests, same KV budget")
    for col in ("allocator", "steps", "utilization", "budget used", "peak reqs", "mean reqs", "preempted"):
        t.add_column(col, justify="left" if col == "allocator" else "right")
    for key in ("paged", "full_accounting", "reserved"):
        tr = report["kv_util"].get(key)
        if tr is None:
            continue
        t.add_row(
            tr["name"],
            str(tr["steps"]),
            f"{tr['utilization']:.1%}",
            f"{tr['budget_occupancy']:.1%}",
            str(tr["peak_concurrent"]),
            f"{tr['mean_concurrent']:.1f}",
            str(tr["preemptions"]),
        )
    return t


def goals_table(report: dict[str, Any]) -> Table:
    """The issue's goals for this workload, with this run's value."""
    t = Table(title="goals")
    for col in ("goal", "target", "this run", "met"):
        t.add_column(col, justify="left" if col == "goal" else "right")
    for g in report["goals"]:
        pct = g["target"] < 1
        fmt = "{:.1%}" if pct else "{:.2f}x"
        met = "-" if g["met"] is None else ("yes" if g["met"] else "NO")
        t.add_row(g["goal"], ("≥ " + fmt).format(g["target"]), _f(g["value"], fmt), met)
    return t


def constrained_lines(report: dict[str, Any]) -> list[str]:
    """The ``--constrained`` comparison in words (empty without a constrained run)."""
    runs = {r["name"]: r for r in report["runs"]}
    con, plain = runs.get("paged-constrained"), runs.get("paged")
    if con is None or plain is None or con.get("structured") is None:
        return []
    g = con["structured"]
    lines = [
        f"constrained: {con['output_tok_s']:.1f} output tok/s, unconstrained {plain['output_tok_s']:.1f}: "
        f"{report['ratios']['constrained_vs_paged']:.2f}x (output tokens per second: a constrained request stops "
        f"when its grammar ends, so it makes {con['output_tokens']} tokens against {plain['output_tokens']})",
    ]
    same = runs.get("paged-same-lengths")
    if same is not None and "constrained_vs_same_lengths" in report["ratios"]:
        lines.append(
            f"  same lengths unconstrained ({same['output_tokens']} tokens): {same['output_tok_s']:.1f} output tok/s; "
            f"constrained {report['ratios']['constrained_vs_same_lengths']:.2f}x of it"
        )
    lines += [
        f"  finished: {', '.join(f'{k} {v}' for k, v in g['finish_reasons'].items())}; "
        f"valid JSON {g['valid_json']} of {con['num_requests']}",
    ]
    if g["mask_s_per_step"] is not None:
        lines.append(
            f"  mask (fill + apply): {g['mask_s_per_step'] * 1e3:.3f} ms per step with constrained rows, "
            f"{g['rows_per_step']:.1f} rows per step on average, {g['mask_steps']} steps, "
            f"{g['mask_seconds']:.2f} s in all ({g['mask_seconds'] / con['seconds']:.1%} of the run)"
        )
    if g["compile_s"] is not None:
        c = g["compile_s"]
        lines.append(
            f"  compile: p50 {c['p50'] * 1e3:.2f} ms, p99 {c['p99'] * 1e3:.2f} ms over {g['compiles']} compiles for "
            f"{con['num_requests']} requests (the compiler's cache serves a repeated schema without compiling)"
        )
    return lines


def lora_lines(report: dict[str, Any]) -> list[str]:
    """The ``--lora`` comparison in words (empty without a LoRA run)."""
    runs = {r["name"]: r for r in report["runs"]}
    lora, base = runs.get("paged-lora"), runs.get("paged")
    if lora is None or base is None or lora.get("lora") is None or "lora_vs_paged" not in report["ratios"]:
        return []
    a = lora["lora"]
    return [
        f"LoRA: {lora['output_tok_s']:.1f} output tok/s on {a['adapters']} adapters of rank {a['rank']} "
        f"({', '.join(a['targets'])}; requests {a['assignment']}), base model {base['output_tok_s']:.1f}: "
        f"{report['ratios']['lora_vs_paged']:.2f}x",
        f"  max_loras {a['max_loras']}, max_lora_rank {a['max_lora_rank']}; {a['slot_loads']} adapter loads into "
        "device slots while timed",
    ]


def moe_lines(report: dict[str, Any]) -> list[str]:
    """A MoE model's bandwidth roofline in words: all bytes against the active bytes a decode token reads, and
    the decode rates of paged and each transformers baseline (empty for a dense model)."""
    roof = report["roofline"]
    moe = None if roof is None else roof.get("moe")
    if moe is None:
        return []
    lines = [
        f"  MoE: {moe['num_layers']} layers of {moe['num_experts']} experts, top-{moe['top_k']}; weights "
        f"{roof['total_weight_bytes'] / 1e6:.1f} MB in all, {roof['weight_bytes_per_token'] / 1e6:.1f} MB read per "
        f"token, of which active experts {moe['active_expert_bytes_per_token'] / 1e6:.1f} MB "
        f"({moe['active_expert_share']:.1%}; all experts {moe['expert_bytes'] / 1e6:.1f} MB)",
    ]
    ours = next((r for r in report["runs"] if r["name"] == "paged"), None)
    for run in report["runs"]:
        ratio = report["ratios"].get(f"decode_paged_vs_{run['name']}")
        if ours is not None and ratio is not None:
            calls = run.get("experts_calls")
            ran = "" if calls is None else f", its experts modules called {calls} times"
            lines.append(
                f"  decode tok/s: paged {ours['decode_tok_s']:.1f}, {run['name']} {run['decode_tok_s']:.1f}{ran}: "
                f"paged is {ratio:.2f}x"
            )
    return lines


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """Print every table that applies to the report's workload, then the roofline line."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: don't squeeze the tables into 80 columns
            console = Console(width=150)
    if report["runs"]:
        console.print(runs_table(report))
    if report["kv_util"] is not None:
        console.print(kv_table(report))
    roof = report["roofline"]
    if roof is not None:
        if roof["kind"] == "flops":
            console.print(
                f"roofline: {roof['achieved_flops_per_s'] / 1e9:.1f} of {roof['peak_flops_per_s'] / 1e9:.1f} "
                f"GFLOP/s measured ({roof['fraction']:.1%}); ceiling {roof['bound_output_tok_s']:.0f} "
                "output tok/s"
            )
        else:
            achieved, peak = roof["achieved_bytes_per_s"] / 1e9, roof["peak_bytes_per_s"] / 1e9
            console.print(
                f"roofline: {achieved:.1f} of {peak:.1f} GB/s of weights ({roof['fraction']:.1%}); "
                f"bound {roof['bound_tok_s']:.0f} tok/s; {roof['weight_bytes_per_token'] / 1e6:.1f} MB "
                "per token"
            )
            for line in moe_lines(report):
                console.print(line)
            for run in report["runs"][1:]:  # baselines that measured their own bytes (llama.cpp)
                other = run.get("roofline")
                if other:
                    console.print(
                        f"  {run['name']}: {other['achieved_bytes_per_s'] / 1e9:.1f} of "
                        f"{other['peak_bytes_per_s'] / 1e9:.1f} GB/s of weights ({other['fraction']:.1%}); "
                        f"{other['weight_bytes_per_token'] / 1e6:.1f} MB per token"
                    )
    from paged_bench.kv_dtypes import kv_dtype_lines

    for line in constrained_lines(report) + lora_lines(report) + kv_dtype_lines(report):
        console.print(line)
    if report["goals"]:
        console.print(goals_table(report))
