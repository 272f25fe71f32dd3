"""The machine-readable JSON report (its schema is documented in the package README)."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paged_conformance.expectations import Expectation
    from paged_conformance.results import CapabilityRow, TestResult

SCHEMA_VERSION = 1
"""Bumped on any incompatible change to the report's layout."""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def build_report(
    context: dict[str, object],
    rows: dict[str, CapabilityRow],
    results: list[TestResult],
    expectations: list[Expectation],
    exit_status: int,
) -> dict[str, object]:
    """Assemble the report; ``context`` holds the backend, grid and oracle sections."""
    import torch  # imported here so that importing the package (and its pytest plugin) stays light

    from paged_core.api import PLUGIN_API_VERSION

    summary: dict[str, int] = {}
    for r in results:
        summary[r.outcome] = summary.get(r.outcome, 0) + 1
    return {
        "schema_version": SCHEMA_VERSION,
        **context,
        "environment": {
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "paged_core_version": _version("paged-core"),
            "paged_conformance_version": _version("paged-conformance"),
            "plugin_api_version": PLUGIN_API_VERSION,
            "platform": platform.platform(),
        },
        "exit_status": exit_status,
        "summary": {"total": len(results), **summary},
        "capabilities": {name: row.to_dict() for name, row in rows.items()},
        "expectations": [e.to_dict() for e in expectations],
        "stale_expectations": [f"{e.label()}: {e.stale_reason()}" for e in expectations if e.stale_reason()],
        "tests": [r.to_dict() for r in results],
    }


def write_report(path: str | Path, report: dict[str, object]) -> None:
    """Write the report as indented JSON, creating parent folders."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
