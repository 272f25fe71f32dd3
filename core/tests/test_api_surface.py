"""Meta-tests on the public surface: everything exported is documented, every backend hook is tested."""

from __future__ import annotations

import inspect
from pathlib import Path

import paged_core
from paged_core import api
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.graph_strategy import GraphCaptureStrategy

SUITE = Path(__file__).resolve().parents[2] / "plugins" / "conformance" / "src" / "paged_conformance"


def _hooks(cls: type) -> list[str]:
    """Public methods (class methods included) defined on ``cls`` itself."""
    return [n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, classmethod))]


def test_package_reexports_api() -> None:
    assert set(api.__all__) <= set(paged_core.__all__)
    for name in api.__all__:
        assert getattr(paged_core, name) is getattr(api, name)


def test_every_exported_class_and_function_has_a_docstring() -> None:
    missing = [
        name
        for name in api.__all__
        if (inspect.isclass(getattr(api, name)) or inspect.isfunction(getattr(api, name)))
        and not inspect.getdoc(getattr(api, name))
    ]
    assert missing == []


def test_every_backend_and_strategy_hook_is_documented() -> None:
    undocumented = [
        f"{cls.__name__}.{name}"
        for cls in (AttentionBackend, GraphCaptureStrategy)
        for name in _hooks(cls)
        if not inspect.getdoc(getattr(cls, name))
    ]
    assert undocumented == []


def test_every_backend_hook_is_exercised_by_the_conformance_suite() -> None:
    source = "\n".join(p.read_text() for p in SUITE.rglob("*.py"))
    untested = [name for name in _hooks(AttentionBackend) if f".{name}(" not in source]
    assert untested == [], f"backend hooks the conformance suite never calls: {untested}"
