"""``paged backends --json``: parseable, complete, and honest about broken plugins."""

from __future__ import annotations

import json
import subprocess
import sys

import paged_core
from paged_core.api import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.cli.main import main


def test_json_lists_every_record(fake_registry, capsys) -> None:
    registry = fake_registry()
    assert main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["paged_core"] == paged_core.__version__ and doc["plugin_api"] == PLUGIN_API_VERSION
    assert doc["accepted_plugin_apis"] == sorted(SUPPORTED_PLUGIN_API_VERSIONS)
    data = doc["backends"]
    assert [d["name"] for d in data] == [r.name for r in registry.records()]
    rows = {d["name"]: d for d in data}
    assert set(rows) == {"good", "npu", "raising", "missing"}
    assert rows["good"]["api_version"] == PLUGIN_API_VERSION and rows["missing"]["api_version"] is None
    assert rows["good"]["status"] == "loaded" and rows["good"]["capabilities"]["dtypes"] == ["bfloat16"]
    assert rows["npu"] == rows["npu"] | {"status": "unavailable", "reason": "no NPU driver", "priority": 9}
    assert rows["raising"]["status"] == "load-error"
    assert rows["raising"]["reason"] == "paged_register_backends() raised RuntimeError: kernel table [sm_90] missing"
    assert rows["missing"]["status"] == "load-error" and "ModuleNotFoundError" in rows["missing"]["reason"]
    assert rows["missing"]["distribution"] == "paged-backend-missing"


def test_json_of_the_installed_backends(capsys) -> None:
    assert main(["backends", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["backends"]
    assert "reference" in {d["name"] for d in data}
    keys = {"name", "status", "priority", "device", "reason", "capabilities", "api_version"}
    assert all(keys <= d.keys() for d in data)


def test_module_entry_point_runs_in_a_fresh_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "paged_core.cli.main", "backends", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert any(d["name"] == "reference" for d in json.loads(done.stdout)["backends"])
