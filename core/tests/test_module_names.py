"""Module names: no two modules (or subpackages) of one package differ by a single letter.

``core_proc`` beside ``core_process`` or ``output`` beside ``outputs`` made readers open the wrong file; a name one
edit away from its neighbour says too little about what it holds. The rule covers every package of paged_core.
"""

from __future__ import annotations

from pathlib import Path

import paged_core

ROOT = Path(paged_core.__file__).parent


def one_edit_apart(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter inserted, removed or replaced."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def package_members(package: Path) -> list[str]:
    """The module and subpackage names of one package directory."""
    modules = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    packages = [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(modules + packages)


def near_names(root: Path) -> list[str]:
    """Every pair of one-edit-apart names, as ``package: a / b``."""
    found = []
    for package in [root, *(p.parent for p in root.rglob("__init__.py") if p.parent != root)]:
        names = package_members(package)
        for i, a in enumerate(names):
            found += [f"{package.relative_to(root.parent)}: {a} / {b}" for b in names[i + 1 :] if one_edit_apart(a, b)]
    return found


def test_one_edit_apart() -> None:
    assert one_edit_apart("output", "outputs")
    assert one_edit_apart("core_proc", "core_prod")
    assert one_edit_apart("sync_client", "async_client")
    assert not one_edit_apart("core_proc", "core_process")
    assert not one_edit_apart("input", "output")


def test_the_checker_finds_a_planted_pair(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py", "sub/output.py", "sub/outputs.py", "config.py"):
        (package / name).write_text("")
    assert near_names(package) == ["pkg/sub: output / outputs"]


def test_no_two_modules_of_a_package_differ_by_one_letter() -> None:
    assert near_names(ROOT) == []
