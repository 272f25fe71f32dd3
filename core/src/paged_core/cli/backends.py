"""``paged backends``: every discovered backend, its status, and why anything is unusable."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from paged_core.contract.capabilities import BackendCapabilities
from paged_core.errors import PagedError
from paged_core.registry import BackendRecord, BackendStatus, load_registry

_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}

_STYLE = {
    BackendStatus.LOADED: "green",
    BackendStatus.UNAVAILABLE: "yellow",
    BackendStatus.DISABLED: "dim",
}


def register(subparsers: Any) -> None:
    """Add the ``backends`` subcommand."""
    parser = subparsers.add_parser(
        "backends",
        help="list discovered backends and why any is unavailable",
        description="List every discovered backend with its status, priority, device and capabilities.",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(func=run)


def capabilities_summary(caps: BackendCapabilities | None) -> str:
    """One short line: dtypes, head sizes, block sizes and graph support."""
    if caps is None:
        return "-"
    d = caps.to_dict()

    def join(values: object) -> str:
        if not isinstance(values, list):
            return str(values)
        return ",".join(_SHORT_DTYPES.get(str(v), str(v)) for v in values)

    return (
        f"dtypes {join(d['dtypes'])}; heads {join(d['head_sizes'])}; "
        f"blocks {join(d['block_sizes'])}; graphs {d['graph_support']}"
    )


def render_table(records: list[BackendRecord]) -> Table:
    """The ``paged backends`` table; every cell is plain text (reasons may contain brackets)."""
    table = Table(title="paged backends", show_lines=False)
    for column in ("name", "status", "priority", "device"):
        table.add_column(column, no_wrap=True)
    for column in ("distribution", "capabilities", "reason"):
        table.add_column(column, overflow="fold")
    for rec in records:
        dist = rec.distribution or "-"
        if rec.distribution_version:
            dist += f" {rec.distribution_version}"
        if rec.builtin:
            dist += " (built-in)"
        elif rec.entry_point:
            dist += f" [{rec.entry_point}]"
        table.add_row(
            Text(rec.name),
            Text(rec.status.value, style=_STYLE.get(rec.status, "bold red")),
            Text(str(rec.priority)),
            Text(rec.device or "-"),
            Text(dist),
            Text(capabilities_summary(rec.capabilities)),
            Text(rec.reason),
        )
    return table


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON). Exit 0 even when plugins are broken: listing them is the point."""
    registry = load_registry()
    records = registry.records()
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
        return 0
    console = Console()
    if not records:
        console.print("No backends found.")
        return 0
    console.print(render_table(records))
    try:
        chosen = registry.select()
        console.print(Text(f"Selected by default: {chosen.name}"))
    except PagedError as exc:
        console.print(Text(f"No backend can be selected: {exc}", style="bold red"))
    return 0
