"""Helpers for the meta-tests: run the suite in-process against a fake backend and read its JSON report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import paged_conformance

HERE = Path(__file__).resolve().parent

SuiteRun = tuple[int, dict[str, Any]]


@pytest.fixture
def run_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., SuiteRun]:
    """``run_suite("ClassName", *pytest_args, **options)`` -> (exit code, parsed JSON report)."""
    monkeypatch.syspath_prepend(str(HERE))
    counter = iter(range(1000))

    def run(fake: str, *extra: str, **options: Any) -> SuiteRun:
        path = tmp_path / f"report{next(counter)}.json"
        backend = fake if ":" in fake or fake in ("reference", "example") else f"conformance_fakes:{fake}"
        options.setdefault("grid", "quick")
        code = paged_conformance.run(backend, json_path=str(path), extra=["-q", "-p", "no:randomly", *extra], **options)
        return code, json.loads(path.read_text())

    return run
