"""A backend that cannot even be loaded gives one clear line and exit code 4, never an INTERNALERROR traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

import paged_conformance


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("def f(:\n", "SyntaxError"),
        ("raise RuntimeError('vendor runtime missing')\n", "RuntimeError: vendor runtime missing"),
    ],
)
def test_module_that_fails_to_import(
    source: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"broken_backend_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = paged_conformance.run(f"{name}:Backend", json_path=str(tmp_path / "r.json"))
    err = capsys.readouterr().err
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in err
    lines = [line for line in err.splitlines() if "paged-conformance" in line]
    assert len(lines) == 1 and f"cannot load backend '{name}:Backend'" in lines[0] and problem in lines[0], err


@pytest.mark.parametrize(
    ("fake", "problem"),
    [
        ("AvailabilityRaises", "availability() raised RuntimeError: driver library not found"),
        ("CapabilitiesAsDict", "capabilities() returned dict, not BackendCapabilities"),
    ],
)
def test_broken_class_hooks(
    fake: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    code = paged_conformance.run(f"conformance_fakes:{fake}", json_path=str(tmp_path / "r.json"))
    err = capsys.readouterr().err
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in err and problem in err, err


def test_version_names_the_suite_the_core_and_the_plugin_api() -> None:
    import subprocess
    import sys

    import paged_core
    from paged_core.api import PLUGIN_API_VERSION

    done = subprocess.run(
        [sys.executable, "-m", "paged_conformance.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("paged-conformance 0.")
    assert f"(checks plugin API {PLUGIN_API_VERSION})" in done.stdout
    assert f"paged-core {paged_core.__version__} (plugin API {PLUGIN_API_VERSION})" in done.stdout
