"""``paged backends``: every discovered backend, its status, and why anything is unusable.

It needs nothing beyond the plain ``paged-core`` install a vendor has: the table uses rich
when it is there (``paged-core[models]`` brings it) and plain aligned text otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from paged_core._version import __version__
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import BackendCapabilities, GraphSupport
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.errors import PagedError
from paged_core.graph.strategy_check import strategy_problem
from paged_core.registry import BackendRecord, BackendRegistry, BackendStatus, load_registry

_SHORT_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float64": "fp64",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}

_STYLE = {
    BackendStatus.LOADED: "green",
    BackendStatus.UNAVAILABLE: "yellow",
    BackendStatus.DISABLED: "dim",
}

COLUMNS = ("name", "status", "priority", "device", "api", "distribution", "capabilities", "reason")


def register(subparsers: Any) -> None:
    """Add the ``backends`` subcommand."""
    parser = subparsers.add_parser(
        "backends",
        help="list discovered backends and why any is unavailable",
        description="List every discovered backend with its status, priority, device, plugin API and capabilities.",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the core's version and plugin API, and a list of backends",
    )
    parser.set_defaults(func=run)


def capabilities_summary(caps: BackendCapabilities | None) -> str:
    """One short line: dtypes, KV-cache dtypes (when they differ), head sizes, block sizes and graph support."""
    if caps is None:
        return "-"
    d = caps.to_dict()

    def join(values: object) -> str:
        if not isinstance(values, list):
            return str(values)
        return ",".join(_SHORT_DTYPES.get(str(v), str(v)) for v in values)

    kv = f"kv {join(d['kv_cache_dtypes'])}; " if d["kv_cache_dtypes"] != d["dtypes"] else ""
    return (
        f"dtypes {join(d['dtypes'])}; {kv}heads {join(d['head_sizes'])}; "
        f"blocks {join(d['block_sizes'])}; graphs {d['graph_support']}"
    )


def graph_problem(rec: BackendRecord) -> str | None:
    """Why a loaded backend that declares graph capture cannot serve it, or ``None``.

    Asks the backend's ``graph_strategy()`` on its device (see :mod:`paged_core.graph.strategy_check`).
    Listing must stay cheap, so the backend is first made without its constructor (which may load
    kernels: the in-tree strategies read only the device); a strategy that needs more is asked again
    of a fully built backend.
    """
    cls, caps = rec.backend_cls, rec.capabilities
    if cls is None or rec.status is not BackendStatus.LOADED or caps is None:
        return None
    if caps.graph_support == GraphSupport.NEVER:
        return None
    light = cls.__new__(cls)
    AttentionBackend.__init__(light, rec.device)
    problem = strategy_problem(light)
    if problem is None or "graph_strategy() raised" not in problem:
        return problem
    try:
        built = cls(rec.device)
    except Exception as exc:  # a vendor's constructor: report it, keep listing
        return f"graph capture declared, but building the backend to ask for its strategy raised {exc!r}"
    return strategy_problem(built)


def row(rec: BackendRecord) -> tuple[str, ...]:
    """The cells of one record, as plain strings in :data:`COLUMNS` order."""
    dist = rec.distribution or "-"
    if rec.distribution_version:
        dist += f" {rec.distribution_version}"
    if rec.builtin:
        dist += " (built-in)"
    elif rec.entry_point:
        dist += f" [{rec.entry_point}]"
    api = getattr(rec.backend_cls, "api_version", None) if rec.backend_cls is not None else None
    return (
        rec.name,
        rec.status.value,
        str(rec.priority),
        rec.device or "-",
        "-" if api is None else f"v{api}",
        dist,
        capabilities_summary(rec.capabilities),
        "; ".join(r for r in (rec.reason, graph_problem(rec)) if r),
    )


def render_table(records: list[BackendRecord]) -> Any:
    """The ``paged backends`` rich table; every cell is plain text (reasons may contain brackets)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"paged backends (paged-core {__version__}, plugin API v{PLUGIN_API_VERSION})")
    for column in COLUMNS[:5]:
        table.add_column(column, no_wrap=True)
    for column in COLUMNS[5:]:
        table.add_column(column, overflow="fold")
    for rec in records:
        cells = row(rec)
        table.add_row(
            *(Text(c, style=_STYLE.get(rec.status, "bold red")) if i == 1 else Text(c) for i, c in enumerate(cells))
        )
    return table


def render_plain(records: list[BackendRecord]) -> str:
    """The same table as aligned text, for installs without rich."""
    rows = [COLUMNS, *(row(r) for r in records)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows]
    return f"paged backends (paged-core {__version__}, plugin API v{PLUGIN_API_VERSION})\n" + "\n".join(lines)


def to_json(registry: BackendRegistry) -> dict[str, object]:
    """What ``--json`` prints: versions, then one object per record."""
    return {
        "paged_core": __version__,
        "plugin_api": PLUGIN_API_VERSION,
        "accepted_plugin_apis": sorted(SUPPORTED_PLUGIN_API_VERSIONS),
        "backends": [{**r.to_dict(), "graph_problem": graph_problem(r)} for r in registry.records()],
    }


def _selected(registry: BackendRegistry) -> tuple[str, bool]:
    try:
        return f"Selected by default: {registry.select().name}", True
    except PagedError as exc:
        return f"No backend can be selected: {exc}", False


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON). Exit 0 even when plugins are broken: listing them is the point."""
    registry = load_registry()
    if args.json:
        print(json.dumps(to_json(registry), indent=2))
        return 0
    records = registry.records()
    try:
        from rich.console import Console
        from rich.text import Text
    except ImportError:
        print(render_plain(records) if records else "No backends found.")
        if records:
            print(_selected(registry)[0])
        return 0
    console = Console()
    if not records:
        console.print("No backends found.")
        return 0
    console.print(render_table(records))
    line, ok = _selected(registry)
    console.print(Text(line, style="" if ok else "bold red"))
    return 0
