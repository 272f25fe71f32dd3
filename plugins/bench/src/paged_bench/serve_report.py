"""The report of ``paged bench serve``: its JSON layout (checked like ``paged bench``'s) and its printed table."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from paged_bench.report import workload_stats
from paged_bench.schema import INT, NUM, OPT_NUM, REPORT, STR, Schema, _obj, validate
from paged_bench.serve_stats import ratios
from paged_bench.workloads import BenchRequest

SCHEMA_VERSION = 1

_SUMMARY_PROPS: dict[str, Schema] = {
    "p50": NUM,
    "p90": NUM,
    "p99": NUM,
    "mean": NUM,
    "min": NUM,
    "max": NUM,
    "count": INT,
}
SUMMARY = _obj(_SUMMARY_PROPS, nullable=True)
SUMMARY_WITH_VALUES = _obj({**_SUMMARY_PROPS, "values": {"type": "array", "items": NUM}}, nullable=True)

SERVE_RUN = _obj(
    {
        "name": STR,
        "server": _obj(
            {
                "url": STR,
                "command": {"type": ["array", "null"], "items": STR},
                "startup_s": OPT_NUM,
                "notes": {"type": "array", "items": STR},
            }
        ),
        "model": STR,
        "seconds": NUM,
        "num_requests": INT,
        "completed": INT,
        "failed": INT,
        "errors": {"type": "array", "items": STR},
        "prompt_tokens": INT,
        "output_tokens": INT,
        "expected_output_tokens": INT,
        "token_count_source": {"type": "string", "enum": ["usage", "chunks"]},
        "output_tok_s": NUM,
        "total_tok_s": NUM,
        "requests_per_s": NUM,
        "ttft_s": SUMMARY_WITH_VALUES,
        "itl_s": SUMMARY,
        "tpot_s": SUMMARY,
        "latency_s": SUMMARY,
    }
)

SERVE_REPORT = _obj(
    {
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "kind": {"type": "string", "enum": ["serve"]},
        "workload": STR,
        "created": STR,
        "command": {"type": "array", "items": STR},
        "config": _obj(
            {
                "workload": STR,
                "servers": {"type": "array", "items": STR},
                "baseline": STR,
                "num_requests": {"type": ["integer", "null"]},
                "output_len": {"type": ["integer", "null"]},
                "seed": {"type": "integer"},
                "concurrency": INT,
                "warmup_requests": INT,
                "engine_flags": {"type": "array", "items": STR},
                "serve_args": {"type": "array", "items": STR},
                "external": {"type": "boolean"},
            }
        ),
        "machine": REPORT["properties"]["machine"],
        "workload_stats": REPORT["properties"]["workload_stats"],
        "runs": {"type": "array", "items": SERVE_RUN},
        "ratios": {"type": "object", "additionalProperties": NUM},
    }
)
"""``paged bench serve --json``: the layout is described in the bench README."""


def build_serve_report(
    config: dict[str, Any],
    machine: dict[str, Any],
    requests: Sequence[BenchRequest],
    runs: Sequence[dict[str, Any]],
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Assemble the report; ratios compare every variant with the first one run."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "serve",
        "workload": config["workload"],
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv if argv is None else argv),
        "config": config,
        "machine": machine,
        "workload_stats": workload_stats(requests),
        "runs": list(runs),
        "ratios": ratios(runs),
    }


def validate_serve_report(report: Any) -> list[str]:
    """Schema errors of a serve report, plus: at least one run, and ratios only against the first."""
    errors = validate(report, SERVE_REPORT)
    if errors:
        return errors
    if not report["runs"]:
        errors.append("$.runs: no variant was measured")
    elif report["runs"][0]["name"] != report["config"]["baseline"]:
        errors.append("$.config.baseline: not the first run")
    return errors


def _ms(summary: dict[str, Any] | None, key: str) -> str:
    return "-" if summary is None else f"{summary[key] * 1e3:.1f}"


def serve_table(report: dict[str, Any]) -> Table:
    """One row per variant; the last columns are its figures over the baseline's (the first row)."""
    cfg = report["config"]
    t = Table(
        title=f"paged bench serve: {report['workload_stats']['num_requests']} {report['workload']} requests, "
        f"{cfg['concurrency']} concurrent streams"
    )
    cols = (
        "server",
        "start s",
        "s",
        "ok",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "TPOT p50 ms",
        f"tok/s vs {cfg['baseline']}",
        "TTFT p50 vs",
        "ITL p50 vs",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "server" else "right")
    rat = report["ratios"]
    base = cfg["baseline"]
    for r in report["runs"]:

        def ratio(suffix: str, name: str = r["name"]) -> str:
            v = rat.get(f"{name}_vs_{base}_{suffix}")
            return "-" if v is None else f"{v:.2f}x"

        start = r["server"]["startup_s"]
        t.add_row(
            r["name"],
            "-" if start is None else f"{start:.1f}",
            f"{r['seconds']:.2f}",
            f"{r['completed']}/{r['num_requests']}",
            f"{r['output_tok_s']:.1f}",
            _ms(r["ttft_s"], "p50"),
            _ms(r["ttft_s"], "p99"),
            _ms(r["itl_s"], "p50"),
            _ms(r["itl_s"], "p99"),
            _ms(r["tpot_s"], "p50"),
            ratio("output_tok_s"),
            ratio("ttft_p50"),
            ratio("itl_p50"),
        )
    return t


def print_serve_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """Print the table, then each variant's notes and errors."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: don't squeeze the table into 80 columns
            console = Console(width=170)
    console.print(serve_table(report))
    for r in report["runs"]:
        for note in r["server"]["notes"]:
            console.print(f"{r['name']}: note: {note}")
        if r["failed"]:
            console.print(f"{r['name']}: {r['failed']} request(s) failed, e.g. {r['errors'][0]}")
        if r["completed"] and r["output_tokens"] != r["expected_output_tokens"]:
            console.print(
                f"{r['name']}: {r['output_tokens']} output tokens, the workload asked for {r['expected_output_tokens']}"
            )
