"""Fixtures for CLI tests: a clean environment, a wide terminal, and a registry of fakes."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest
import torch

import paged_core.cli.backends as backends_cli
import paged_core.registry.registry as registry_module
from paged_core.api import AttentionBackend, Availability, BackendCapabilities, hookimpl
from paged_core.registry import BackendRegistry, PluginSource


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No selection variables from the developer's shell; wide output so rich never folds a reason."""
    for var in ("PAGED_BACKEND", "PAGED_BACKENDS_ALLOW", "PAGED_BACKENDS_DENY", "PAGED_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(registry_module, "_cached", None)  # restored afterwards


def _backend(name: str, priority: int, available: bool = True, reason: str = "") -> type[AttentionBackend]:
    def fail(self: object, *args: object) -> None:
        raise AssertionError("kernels must not run")

    return type(
        f"Cli_{name}",
        (AttentionBackend,),
        {
            "name": name,
            "priority": priority,
            "api_version": 1,
            "availability": classmethod(lambda cls: Availability(available, reason, "cpu")),
            "capabilities": classmethod(
                lambda cls: BackendCapabilities(dtypes=frozenset({torch.bfloat16}), block_sizes=(16, 32))
            ),
            "write_kv": fail,
            "attention": fail,
            "copy_blocks": fail,
        },
    )


def _raise() -> list[type[AttentionBackend]]:
    raise RuntimeError("kernel table [sm_90] missing\nsecond line")


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> Callable[..., BackendRegistry]:
    """Install a registry of fakes as what ``paged backends`` sees: good, unavailable, broken ones.

    Call it with ``available=False`` to make every backend unavailable.
    """

    def build(available: bool = True) -> BackendRegistry:
        good = types.ModuleType("cli_fake_good")
        good.paged_register_backends = hookimpl(  # type: ignore[attr-defined]
            lambda: [_backend("good", 5, available, "no npu"), _backend("npu", 9, False, "no NPU driver")]
        )
        raising = types.ModuleType("cli_fake_raising")
        raising.paged_register_backends = hookimpl(_raise)  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "cli_fake_good", good)
        monkeypatch.setitem(sys.modules, "cli_fake_raising", raising)
        sources = [
            PluginSource("good", "cli_fake_good", "paged-backend-good", "1.2"),
            PluginSource("raising", "cli_fake_raising", "paged-backend-raising", "0.1"),
            PluginSource("missing", "cli_fake_missing_module", "paged-backend-missing", "3.0"),
        ]
        registry = BackendRegistry.from_entry_points(sources, builtins={})
        monkeypatch.setattr(backends_cli, "load_registry", lambda: registry)
        return registry

    return build
