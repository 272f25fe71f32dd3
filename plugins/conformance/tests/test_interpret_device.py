"""``--device DEV-interpret``: the device part, and TRITON_INTERPRET set before the backend loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paged_conformance.plugin import split_device


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("cpu-interpret", ("cpu", True)),
        ("cuda:1-interpret", ("cuda:1", True)),
        ("-interpret", ("cpu", True)),
        ("cpu", ("cpu", False)),
        (None, (None, False)),
    ],
)
def test_split_device(value: str | None, expected: tuple[str | None, bool]) -> None:
    assert split_device(value) == expected


PROBE = """
import os
from paged_core.testing import ReferenceBackend

SEEN = os.environ.get("TRITON_INTERPRET")


class ProbeBackend(ReferenceBackend):
    name = "probe"

    @classmethod
    def capabilities(cls):
        if SEEN != "1":
            raise RuntimeError(f"TRITON_INTERPRET was {SEEN!r} when the backend module was imported")
        return super().capabilities()
"""


def test_interpret_device_sets_triton_interpret_before_loading(tmp_path: Path) -> None:
    """The backend's module already sees TRITON_INTERPRET=1 when imported, and tests run on the CPU."""
    (tmp_path / "probe_backend.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    code = (
        "import sys; from paged_conformance.cli import main; sys.exit(main(['run', '--backend', "
        "'probe_backend:ProbeBackend', '--device', 'cpu-interpret', '--quick', '--', '-q', '-k', "
        "'test_kv_cache_shape']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "probe on cpu" in proc.stdout
