"""The JSON report, the JUnit XML, the terminal table and the expectations file, end to end."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from paged_conformance import SCHEMA_VERSION, ExpectationsError, parse_expectations


def test_json_report_schema(run_suite, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junit = tmp_path / "junit.xml"
    code, report = run_suite("GoodFake", "-k", "copy_blocks or refuses", junitxml=str(junit))
    assert code == 0
    assert report["schema_version"] == SCHEMA_VERSION
    backend = report["backend"]
    assert (backend["name"], backend["device"], backend["class"]) == ("good-fake", "cpu", "conformance_fakes:GoodFake")
    assert {"torch_version", "python_version", "paged_core_version"} <= set(report["environment"])
    assert report["grid"]["name"] == "quick" and report["oracle"] == "reference"
    row = report["capabilities"]["copy_blocks"]
    assert row == {"declared": True, "status": "pass", "counts": row["counts"]} and row["counts"]["passed"] == 1
    test = next(t for t in report["tests"] if "test_copy_blocks" in t["nodeid"])
    assert (
        test["outcome"] == "passed"
        and test["duration"] >= 0
        and test["capabilities"] == ["copy_blocks", "block_size:4"]
    )
    cases = ET.parse(junit).getroot().iter("testcase")
    assert sum(1 for _ in cases) == report["summary"]["total"]
    out = capsys.readouterr().out
    assert "paged-conformance: good-fake on cpu" in out and "copy_blocks" in out and "capability" in out


def test_failure_message_is_short_and_specific(run_suite) -> None:
    code, report = run_suite("OffByOneMask", "-k", "prefill-long")
    assert code != 0
    failed = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert failed and "vs oracle mismatch" in failed[0]["message"] and "row" in failed[0]["message"]


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "expect.toml"
    path.write_text(text)
    return str(path)


def test_xfail_and_skip_entries_turn_known_failures_green(run_suite, tmp_path: Path) -> None:
    expect = _write(
        tmp_path,
        """
[[expect]]
capability = "batch:prefill"
status = "xfail"
reason = "mask bug tracked in VENDOR-1"

[[expect]]
node = "*test_attention[*-mixed-*"
status = "xfail"
reason = "same bug"

[[expect]]
node = "*test_attention[*-prefix-*"
status = "skip"
reason = "same bug"

[[expect]]
node = "*test_attention[*-wide-*]"
status = "xfail"
reason = "same bug"

[[expect]]
capability = "batch:long_context"
status = "xfail"
reason = "same bug"
""",
    )
    code, report = run_suite("OffByOneMask", "-k", "test_attention", expect=expect)
    assert code == 0, [t for t in report["tests"] if t["outcome"] == "failed"]
    assert report["capabilities"]["batch:prefill"]["status"] == "xfail"
    assert report["capabilities"]["batch:prefix"]["counts"]["skipped"] > 0
    assert report["stale_expectations"] == []


def test_stale_entries_warn_and_fail_under_strict(run_suite, tmp_path: Path) -> None:
    expect = _write(
        tmp_path,
        """
[[expect]]
node = "*test_does_not_exist*"
status = "skip"
reason = "stale on purpose"

[[expect]]
capability = "copy_blocks"
status = "xfail"
reason = "was broken once, fixed since"
""",
    )
    code, report = run_suite("GoodFake", "-k", "copy_blocks", expect=expect)
    assert code == 0
    stale = report["stale_expectations"]
    assert len(stale) == 2 and "matches no test" in stale[0] and "passed" in stale[1]
    strict_code, _ = run_suite("GoodFake", "-k", "copy_blocks", expect=expect, strict=True)
    assert strict_code != 0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[expect]]\nstatus = "xfail"\nreason = "x"', "exactly one of"),
        ('[[expect]]\nnode = "a"\nstatus = "maybe"\nreason = "x"', "status must be"),
        ('[[expect]]\nnode = "a"\nstatus = "skip"', "reason"),
        ('[[expect]]\nnode = "a"\nstatus = "skip"\nreason = "x"\ncolour = 1', "unknown key"),
        ("expect = [", "not valid TOML"),
    ],
)
def test_malformed_expectations_are_refused(text: str, problem: str) -> None:
    with pytest.raises(ExpectationsError, match=problem):
        parse_expectations(text)


def test_missing_backend_is_a_usage_error(run_suite, tmp_path: Path) -> None:
    import paged_conformance

    code = paged_conformance.run("conformance_fakes:NoSuchBackend", json_path=str(tmp_path / "r.json"))
    assert code == pytest.ExitCode.USAGE_ERROR
