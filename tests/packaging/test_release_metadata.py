"""Release metadata every distribution must carry: declared plugin API versions, core bounds that match
them, one version source per distribution, the licence, and a bounded setuptools (AST and TOML checks)."""

from __future__ import annotations

import ast
import importlib.metadata as md
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from paged_core._version import __version__ as CORE_VERSION
from paged_core.contract.version import PLUGIN_API_VERSION

ROOT = Path(__file__).resolve().parents[2]


def _pyproject(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))


def _registers_a_backend(root: Path) -> bool:
    return "paged_core.backends" in _pyproject(root)["project"].get("entry-points", {})


_UNDER_BACKENDS = sorted(p for p in (ROOT / "backends").iterdir() if (p / "pyproject.toml").is_file())
BACKENDS = [ROOT / "plugins" / "example-backend", *(p for p in _UNDER_BACKENDS if _registers_a_backend(p))]
KERNEL_LIBRARIES = [p for p in _UNDER_BACKENDS if not _registers_a_backend(p)]
"""Kernel source shared by backends (``backends/triton``): a distribution without a backend of its own."""
TOOLS = [ROOT / "plugins" / "conformance", ROOT / "plugins" / "bench"]
"""Distributions built on paged-core that are neither a backend nor kernels: the suite and the benchmark harness."""
DISTRIBUTIONS = [ROOT / "core", *TOOLS, *KERNEL_LIBRARIES, *BACKENDS]


def declared_api_versions(source: str, filename: str = "<source>") -> dict[str, int | None]:
    """Each backend class -> the int literal its body assigns to ``api_version``.

    A backend class derives from ``AttentionBackend`` or from a base named ``...Backend``/``...BackendBase`` (a
    kernel library's shared half, such as ``paged_triton.backend.TritonBackend``); each must still declare its own.
    """
    found: dict[str, int | None] = {}
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
        if not any(b.endswith(("Backend", "BackendBase")) for b in bases):
            continue
        value: int | None = None
        for stmt in node.body:
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == "api_version" for t in targets):
                literal = stmt.value
                if isinstance(literal, ast.Constant) and type(literal.value) is int:
                    value = literal.value
        found[node.name] = value
    return found


def backend_classes(root: Path) -> dict[str, int | None]:
    """``file:Class`` -> declared API version for every backend class in a distribution's sources."""
    out: dict[str, int | None] = {}
    for path in sorted((root / "src").rglob("*.py")):
        for cls, api in declared_api_versions(path.read_text(encoding="utf-8"), str(path)).items():
            out[f"{path.relative_to(ROOT)}:{cls}"] = api
    return out


def test_the_scan_catches_an_implicit_or_computed_api_version() -> None:
    source = (
        "class Implicit(AttentionBackend):\n    name = 'a'\n"
        "class Computed(api.AttentionBackend):\n    api_version = PLUGIN_API_VERSION\n"
        "class Declared(AttentionBackend):\n    api_version = 1\n"
        "class Derived(TritonBackend):\n    name = 'b'\n"
        "class Unrelated(Base):\n    pass\n"
    )
    assert declared_api_versions(source) == {"Implicit": None, "Computed": None, "Declared": 1, "Derived": None}


@pytest.mark.parametrize("root", BACKENDS, ids=lambda p: p.name)
def test_every_in_tree_backend_declares_its_api_version_as_a_literal(root: Path) -> None:
    classes = backend_classes(root)
    assert classes, f"no AttentionBackend subclass found under {root}"
    implicit = [name for name, api in classes.items() if api is None]
    assert not implicit, f"backends leaving api_version implicit (set `api_version = N`): {implicit}"


@pytest.mark.parametrize("root", BACKENDS, ids=lambda p: p.name)
def test_backend_bounds_paged_core_to_the_cores_that_accept_its_api(root: Path) -> None:
    apis = set(backend_classes(root).values())
    assert len(apis) == 1, f"{root.name}: one API version per distribution, found {apis}"
    (api,) = apis
    assert isinstance(api, int)
    # The installed metadata: what pip sees, whether pyproject.toml lists it or setup.py computes it.
    deps = md.requires(_pyproject(root)["project"]["name"]) or []
    (core_req,) = [Requirement(d) for d in deps if Requirement(d).name == "paged-core"]
    spec = core_req.specifier
    # paged-core 0.N implements API N and accepts N-1: an API-N backend runs on 0.N and 0.(N+1).
    assert Version(f"0.{api}.0") in spec and Version(f"0.{api + 1}.9") in spec, (root.name, core_req)
    assert Version(f"0.{api + 2}.0") not in spec and Version(f"0.{api - 1}.9") not in spec, (root.name, core_req)


def test_core_minor_version_is_the_plugin_api_version() -> None:
    assert Version(CORE_VERSION).minor == PLUGIN_API_VERSION and Version(CORE_VERSION).major == 0


def test_core_version_has_one_source() -> None:
    project = _pyproject(ROOT / "core")
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "paged_core._version.__version__"
    import paged_core

    assert paged_core.__version__ == CORE_VERSION == md.version("paged-core")


@pytest.mark.parametrize("root", DISTRIBUTIONS, ids=lambda p: p.name)
def test_distribution_ships_the_licence_and_modern_metadata(root: Path) -> None:
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    project = _pyproject(root)["project"]
    assert project["license"] == "Apache-2.0", "an SPDX string, not the deprecated table"
    assert project["license-files"] == ["LICENSE"]
    assert (root / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert project["readme"] == "README.md" and (root / "README.md").is_file()
    assert project.get("urls") and project.get("classifiers")
    assert not any(c.startswith("License ::") for c in project["classifiers"]), "PEP 639: no licence classifiers"
    (setuptools,) = [r for r in _pyproject(root)["build-system"]["requires"] if r.startswith("setuptools")]
    spec = SpecifierSet(setuptools.removeprefix("setuptools"))
    assert Version("77") in spec and Version("76.9") not in spec and Version("100") not in spec, setuptools
    assert "{ text" not in text


def test_changelog_names_every_distribution_at_its_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for root in DISTRIBUTIONS:
        project = _pyproject(root)["project"]
        version = CORE_VERSION if project["name"] == "paged-core" else project["version"]
        assert f"{project['name']} {version}" in changelog, f"CHANGELOG.md has no entry for {project['name']} {version}"
