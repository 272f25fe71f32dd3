"""No folder at the repository root may share its name with a module an installed distribution provides.

pytest's importlib mode names a test module after its path from the root (``backends/cpu/tests/test_x.py`` is
``backends.cpu.tests.test_x``) and puts a stand-in package for every missing parent into ``sys.modules``; a
root folder named like a real distribution's module (PyPI's ``kernels``, which transformers imports) then
shadows that distribution for the rest of the run.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def root_package_names(root: Path) -> set[str]:
    """Names of root folders that hold Python files: the stand-in packages pytest may create."""
    return {
        p.name
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name.isidentifier() and next(p.rglob("*.py"), None)
    }


def shadowed(root: Path, provided: dict[str, list[str]]) -> dict[str, list[str]]:
    """Root folder name -> the installed distributions whose module it would shadow."""
    return {name: sorted(provided[name]) for name in sorted(root_package_names(root)) if name in provided}


def test_no_root_folder_shadows_an_installed_distribution() -> None:
    clashes = shadowed(ROOT, md.packages_distributions())
    assert not clashes, f"root folders named like installed distributions' modules (rename them): {clashes}"


def test_the_check_sees_a_clash(tmp_path: Path) -> None:
    (tmp_path / "kernels" / "triton").mkdir(parents=True)
    (tmp_path / "kernels" / "triton" / "x.py").write_text("", encoding="utf-8")
    (tmp_path / "docs").mkdir()  # no Python files: never imported as a package
    provided = {"kernels": ["kernels"], "docs": ["somedist"]}
    assert shadowed(tmp_path, provided) == {"kernels": ["kernels"]}
