"""``paged bench`` is paged-bench's, reached through paged-core's one dispatch module; without paged-bench it is
the one-line hint to install ``paged-core[bench]``; and paged_core imports paged_bench nowhere else."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import paged_bench.cli
import paged_core
from paged_core import extras
from paged_core.cli.main import build_parser, main

CORE_SRC = Path(paged_core.__file__).resolve().parent
DISPATCH = CORE_SRC / "cli" / "bench.py"


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names (at any depth: lazy imports count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_bench_subcommand_is_paged_benchs() -> None:
    args = build_parser().parse_args(["bench", "kv-util"])
    assert args.func is paged_bench.cli.run
    assert paged_bench.cli.EXTRA == "bench"  # what `paged` checks before running it


def test_only_the_dispatch_module_of_paged_core_imports_paged_bench() -> None:
    importers = sorted(
        str(path.relative_to(CORE_SRC))
        for path in CORE_SRC.rglob("*.py")
        if any(name.partition(".")[0] == "paged_bench" for name in imported_modules(path))
    )
    assert importers == ["cli/bench.py"]
    assert imported_modules(DISPATCH) >= {"paged_bench.cli"}


def test_the_scan_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from paged_bench.run import run_bench\n    import paged_bench\n", encoding="utf-8")
    assert imported_modules(module) == {"paged_bench.run", "paged_bench"}


@pytest.mark.parametrize("argv", [["bench", "throughput"], ["bench", "--help"], ["bench"]])
def test_without_paged_bench_bench_is_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setitem(sys.modules, "paged_bench.cli", None)  # its import now fails, as when not installed
    monkeypatch.setattr(extras, "_installed", lambda dist: dist != "paged-bench")
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "paged bench needs paged-core[bench] (missing: paged-bench); install it with: pip install 'paged-core[bench]'\n"
    )
