"""Collecting per-test outcomes and folding them into per-capability rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from paged_conformance.grid import LINEAR_FORMATS, dtype_name, iter_universe
from paged_core.api import BackendCapabilities, GraphSupport

OUTCOMES = ("passed", "failed", "error", "xfailed", "xpassed", "skipped", "n/a")
NA_PREFIX = "N/A:"
"""Skip reasons starting with this mark an undeclared capability, not a skipped test."""

FEATURES = (
    "kv_cache_shape",
    "capability_check",
    "write_kv",
    "padding",
    "copy_blocks",
    "scale",
    "strided_inputs",
    "sliding_window",
    "soft_cap",
    "graph",
)
"""Capability rows that are not an axis of the grid."""


@dataclass
class TestResult:
    """One test's outcome across its setup, call and teardown phases."""

    nodeid: str
    capabilities: list[str]
    outcome: str = "passed"
    duration: float = 0.0
    message: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "nodeid": self.nodeid,
            "capabilities": self.capabilities,
            "outcome": self.outcome,
            "duration": round(self.duration, 4),
            "message": self.message,
        }


def _short(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:500]
    if isinstance(report.longrepr, tuple):  # skips: (path, line, reason)
        return str(report.longrepr[2])[:500]
    return str(report.longrepr or "").strip().splitlines()[-1][:500] if report.longrepr else ""


def absorb(result: TestResult, report: pytest.TestReport) -> None:
    """Fold one phase's report into ``result`` (the worst phase wins)."""
    result.duration += report.duration
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
        if result.outcome not in ("failed", "error"):
            result.outcome, result.message = outcome, _short(report)
    elif report.skipped:
        if xfail:
            result.outcome, result.message = "xfailed", str(report.wasxfail)
        else:
            msg = _short(report).removeprefix("Skipped: ")
            result.outcome = "n/a" if msg.startswith(NA_PREFIX) else "skipped"
            result.message = msg
    elif report.passed and xfail and report.when == "call":
        result.outcome, result.message = "xpassed", str(report.wasxfail)


@dataclass
class CapabilityRow:
    """One line of the report's table."""

    name: str
    declared: bool
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    @property
    def status(self) -> str:
        """fail > xfail > pass > skip; then n/a (undeclared) or "not run" (declared, outside this grid)."""
        c = self.counts
        if c["failed"] or c["error"]:
            return "fail"
        if c["xfailed"]:
            return "xfail"
        if c["passed"] or c["xpassed"]:
            return "pass"
        if c["skipped"]:
            return "skip"
        return "not run" if self.declared and not c["n/a"] else "n/a"

    def to_dict(self) -> dict[str, object]:
        return {"declared": self.declared, "status": self.status, "counts": dict(self.counts)}


def declared_rows(
    caps: BackendCapabilities,
    linear_formats: frozenset[str] = frozenset(),
    invariant_linear: frozenset[str] = frozenset(),
    invariant_layer_ops: bool = False,
) -> dict[str, CapabilityRow]:
    """Every capability row for a backend, each marked declared or not.

    ``linear_formats`` are the packed formats its ``fused_ops()`` declares:
    each is a declared ``linear_format:*`` row, and ``linear_format:fallback``
    (the reference-packed route) is declared when some known format is not.
    ``batch_invariance:*`` rows are declared by ``caps.batch_invariant`` (attention),
    ``invariant_layer_ops`` and the weight kinds of ``invariant_linear`` (``fused_ops()``'s
    ``batch_invariant_layer_ops`` and ``batch_invariant_linear``).
    """
    rows: dict[str, CapabilityRow] = {}
    for axis, value in iter_universe():
        if axis == "dtype":
            declared = value in {dtype_name(d) for d in caps.dtypes}
        elif axis == "head_size":
            declared = caps.head_sizes is None or int(value) in caps.head_sizes
        elif axis == "gqa":
            declared = caps.gqa_ratios is None or int(value) in caps.gqa_ratios
        elif axis == "kv_dtype":
            declared = value in {dtype_name(d) for d in caps.effective_kv_cache_dtypes}
        elif axis == "linear_format":
            declared = value in linear_formats if value != "fallback" else bool(set(LINEAR_FORMATS) - linear_formats)
        elif axis == "batch_invariance":
            declared = {"attention": caps.batch_invariant, "layer_ops": invariant_layer_ops}.get(
                value, value.removeprefix("linear:") in invariant_linear
            )
        else:
            declared = True
        rows[f"{axis}:{value}"] = CapabilityRow(f"{axis}:{value}", declared)
    for b in caps.block_sizes:
        rows[f"block_size:{b}"] = CapabilityRow(f"block_size:{b}", True)
    for d in caps.effective_kv_cache_dtypes:  # declared ones the suite cannot test show as "not run"
        rows.setdefault(f"kv_dtype:{dtype_name(d)}", CapabilityRow(f"kv_dtype:{dtype_name(d)}", True))
    optional = {
        "sliding_window": caps.sliding_window,
        "soft_cap": caps.logits_soft_cap,
        "graph": caps.graph_support > GraphSupport.NEVER,
    }
    for name in FEATURES:
        rows[name] = CapabilityRow(name, optional.get(name, True))
    return rows


def fold(rows: dict[str, CapabilityRow], results: list[TestResult]) -> dict[str, CapabilityRow]:
    """Count every result under each of its capabilities (unknown ones get an undeclared row)."""
    for r in results:
        for cap in r.capabilities:
            row = rows.setdefault(cap, CapabilityRow(cap, False))
            row.counts[r.outcome] += 1
    return rows


def render_table(rows: dict[str, CapabilityRow]) -> list[str]:
    """The capability x status table as plain text lines."""
    head = ("capability", "declared", "status", "pass", "fail", "xfail", "skip", "n/a")
    body = []
    for row in rows.values():
        c = row.counts
        body.append(
            (
                row.name,
                "yes" if row.declared else "no",
                row.status,
                str(c["passed"] + c["xpassed"]),
                str(c["failed"] + c["error"]),
                str(c["xfailed"]),
                str(c["skipped"]),
                str(c["n/a"]),
            )
        )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{'<' if i < 3 else '>'}{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in body)]
