"""Fixtures for registry tests: fake backends, in-process plugin modules, on-disk distribution metadata."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_core.api import AttentionBackend, Availability, BackendCapabilities, hookimpl
from paged_core.contract.version import PLUGIN_API_VERSION
from paged_core.registry import ENTRY_POINT_GROUP, BackendRegistry

FILTER_VARS = ("PAGED_BACKEND", "PAGED_BACKENDS_ALLOW", "PAGED_BACKENDS_DENY", "PAGED_DISABLE_PLUGINS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own selection variables must not leak into these tests."""
    for var in FILTER_VARS:
        monkeypatch.delenv(var, raising=False)


def _make_backend(
    name: str,
    *,
    priority: int = 0,
    available: bool = True,
    reason: str = "",
    device: str = "cpu",
    api_version: int = PLUGIN_API_VERSION,
    availability_error: Exception | None = None,
    capabilities_error: Exception | None = None,
) -> type[AttentionBackend]:
    """A concrete backend class whose class methods behave as asked (its kernels are never called)."""

    def availability(cls: type) -> Availability:
        if availability_error is not None:
            raise availability_error
        return Availability(available, reason, device)

    def capabilities(cls: type) -> BackendCapabilities:
        if capabilities_error is not None:
            raise capabilities_error
        return BackendCapabilities(dtypes=frozenset({torch.float32}), block_sizes=(16, 32))

    def unused(self: object, *args: object) -> Any:
        raise AssertionError("the registry must not run kernels")

    namespace = {
        "name": name,
        "priority": priority,
        "api_version": api_version,
        "availability": classmethod(availability),
        "capabilities": classmethod(capabilities),
        "write_kv": unused,
        "attention": unused,
        "copy_blocks": unused,
    }
    return type(f"Fake_{name.replace('-', '_')}", (AttentionBackend,), namespace)


@pytest.fixture
def make_backend() -> Callable[..., type[AttentionBackend]]:
    """Factory of fake backend classes: ``make_backend("alpha", priority=3, available=False, ...)``."""
    return _make_backend


class FakePlugins:
    """Builds plugins without installing anything.

    Plugin modules live only in ``sys.modules`` (an entry point's import finds
    them there); distributions are ``*.dist-info`` folders under a temporary
    root, so their entry points carry real distribution metadata.
    """

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self._monkeypatch = monkeypatch

    def module(self, module_name: str, **attributes: object) -> types.ModuleType:
        """An importable module with the given attributes (e.g. ``paged_register_backends=...``)."""
        module = types.ModuleType(module_name)
        for key, value in attributes.items():
            setattr(module, key, value)
        self._monkeypatch.setitem(sys.modules, module_name, module)
        return module

    def hook(self, module_name: str, fn: Callable[..., object]) -> types.ModuleType:
        """A plugin module whose ``paged_register_backends`` hookimpl is ``fn``."""
        return self.module(module_name, paged_register_backends=hookimpl(fn))

    def provides(self, module_name: str, *classes: type[AttentionBackend]) -> types.ModuleType:
        """A well-formed plugin module returning ``classes``."""
        return self.hook(module_name, lambda: list(classes))

    def dist(self, dist_name: str, version: str = "1.0", **entry_points: str) -> None:
        """Write metadata for an installed distribution declaring ``name=value`` backend entry points."""
        info = self.root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
        lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{k} = {v}" for k, v in entry_points.items())]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")

    def entry_points(self) -> list[md.EntryPoint]:
        """Every backend entry point of the distributions written so far, in name order."""
        dists = sorted(md.distributions(path=[str(self.root)]), key=lambda d: d.metadata["Name"])
        return [ep for d in dists for ep in d.entry_points if ep.group == ENTRY_POINT_GROUP]

    def registry(self, builtins: dict[str, str] | None = None) -> BackendRegistry:
        """A registry of these distributions; no built-ins unless given."""
        return BackendRegistry.from_entry_points(self.entry_points(), builtins=builtins or {})


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePlugins:
    """A fresh :class:`FakePlugins` rooted in this test's temporary folder."""
    return FakePlugins(tmp_path, monkeypatch)
