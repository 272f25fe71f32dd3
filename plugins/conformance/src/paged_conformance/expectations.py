"""The expectations file: known failures and skips a backend ships with its conformance run.

A TOML file with one ``[[expect]]`` table per entry::

    [[expect]]
    node = "check_attention.py::test_attention[float16-*]"   # * and ? are wildcards; [ ] are literal
    status = "xfail"                                         # or "skip"
    reason = "fp16 accumulates in fp16 on this chip"

    [[expect]]
    capability = "block_size:256"                            # a row of the report's table
    status = "skip"
    reason = "needs 64 KiB of shared memory"

An entry that matches no test, or an ``xfail`` whose tests all passed, is
stale: it warns, and fails the run under ``--strict``.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

STATUSES = ("xfail", "skip")


class ExpectationsError(ValueError):
    """The expectations file is malformed; the message names the entry and the problem."""


def node_glob(pattern: str) -> str:
    """``pattern`` for :func:`fnmatch.fnmatchcase` with ``[`` and ``]`` taken literally.

    Node ids hold brackets (``test_attention[float16-...]``); fnmatch would
    read them as a character class. Only ``*`` and ``?`` stay wildcards.
    """
    return "".join("[[]" if c == "[" else "[]]" if c == "]" else c for c in pattern)


@dataclass
class Expectation:
    """One entry: what it matches, what to expect, why, and what it matched during this run."""

    status: str
    reason: str
    node: str | None = None
    capability: str | None = None
    matched: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def label(self) -> str:
        """How the entry is named in warnings and reports."""
        return f"node={self.node!r}" if self.node is not None else f"capability={self.capability!r}"

    def matches(self, nodeid: str, capabilities: list[str]) -> bool:
        """Whether this entry applies to a test with ``nodeid`` counted under ``capabilities``."""
        if self.node is not None:
            pattern = node_glob(self.node)
            return fnmatch.fnmatchcase(nodeid, pattern) or fnmatch.fnmatchcase(nodeid, "*" + pattern)
        return self.capability in capabilities

    def stale_reason(self) -> str | None:
        """Why this entry is stale, or None when it earned its place."""
        if not self.matched:
            return "matches no test"
        if self.status == "xfail" and self.passed and len(self.passed) == len(self.matched):
            return f"expected to fail but all {len(self.passed)} matching test(s) passed"
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "capability": self.capability,
            "status": self.status,
            "reason": self.reason,
            "matched": len(self.matched),
            "stale": self.stale_reason(),
        }


def parse_expectations(text: str, source: str = "<expectations>") -> list[Expectation]:
    """Parse the TOML text; raise :class:`ExpectationsError` naming the bad entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{source}: not valid TOML: {exc}") from exc
    unknown = set(data) - {"expect"}
    if unknown:
        raise ExpectationsError(f"{source}: unknown top-level key(s) {sorted(unknown)}; use [[expect]] tables")
    entries = data.get("expect", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"{source}: 'expect' must be an array of tables ([[expect]])")
    out = []
    for i, raw in enumerate(entries):
        where = f"{source}: entry {i + 1}"
        extra = set(raw) - {"node", "capability", "status", "reason"}
        if extra:
            raise ExpectationsError(f"{where}: unknown key(s) {sorted(extra)}")
        if ("node" in raw) == ("capability" in raw):
            raise ExpectationsError(f"{where}: give exactly one of 'node' or 'capability'")
        status = raw.get("status")
        if status not in STATUSES:
            raise ExpectationsError(f"{where}: status must be one of {list(STATUSES)}, got {status!r}")
        reason = raw.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ExpectationsError(f"{where}: a non-empty 'reason' is required")
        out.append(Expectation(status=status, reason=reason, node=raw.get("node"), capability=raw.get("capability")))
    return out


def load_expectations(path: str | Path) -> list[Expectation]:
    """Read and parse an expectations file."""
    p = Path(path)
    if not p.is_file():
        raise ExpectationsError(f"expectations file {str(p)!r} does not exist")
    return parse_expectations(p.read_text(encoding="utf-8"), str(p))
