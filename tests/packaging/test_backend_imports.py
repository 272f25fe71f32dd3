"""Backend packages import ``paged_core.api`` (the contract) and ``paged_core.testing`` (the oracles and harness
of their tests and benchmarks), nothing else from paged_core (an AST check)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ("paged_core.api", "paged_core.testing")


def backend_roots(root: Path = ROOT) -> list[Path]:
    """The example backend plus every package under ``backends/``."""
    roots = [root / "plugins" / "example-backend"]
    backends = root / "backends"
    if backends.is_dir():
        roots += sorted(p for p in backends.iterdir() if p.is_dir())
    return [r for r in roots if r.is_dir()]


def _forbidden(module: str) -> bool:
    inside = module == "paged_core" or module.startswith("paged_core.")
    return inside and not any(module == a or module.startswith(a + ".") for a in ALLOWED)


def violations(path: Path) -> list[str]:
    """``file:line: import`` for every reach into paged_core beyond its api and testing modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from paged_core import api` (or testing) is fine; `from paged_core import registry` is not.
            names = [f"{node.module}.{a.name}" if node.module == "paged_core" else node.module for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found += [f"{path}:{node.lineno}: {n}" for n in names if _forbidden(n)]
    return found


def scan(roots: list[Path]) -> list[str]:
    """Violations in every ``.py`` file under ``roots``."""
    return [v for r in roots for p in sorted(r.rglob("*.py")) if ".venv" not in p.parts for v in violations(p)]


def test_backends_import_only_the_public_api() -> None:
    roots = backend_roots()
    assert roots, "no backend package found to check"
    assert sum(1 for r in roots for _ in r.rglob("*.py")) > 3
    assert scan(roots) == []


@pytest.mark.parametrize(
    "source",
    [
        "from paged_core.contract.backend import AttentionBackend\n",
        "import paged_core.registry\n",
        "from paged_core import registry\n",
        "import paged_core\n",
        "def f():\n    from paged_core.graph import CompiledStrategy\n",
        "import importlib\nimportlib.import_module('paged_core.reference')\n",
    ],
)
def test_a_planted_bad_import_is_caught(tmp_path: Path, source: str) -> None:
    pkg = tmp_path / "backends" / "bad" / "src" / "bad_backend"
    pkg.mkdir(parents=True)
    allowed = (
        "from paged_core.api import AttentionBackend\nfrom paged_core import api\n"
        "from paged_core.testing import ReferenceBackend\nfrom paged_core import testing"
    )
    (pkg / "__init__.py").write_text(allowed + "\n")
    (pkg / "kernels.py").write_text(source)
    found = scan(backend_roots(tmp_path))
    assert len(found) == 1 and "kernels.py" in found[0], found
