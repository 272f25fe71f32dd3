"""``paged backends`` reports a backend that declares graph capture but has no strategy to serve it."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

import paged_core.cli.backends as backends_cli
from paged_core.api import (
    AttentionBackend,
    Availability,
    BackendCapabilities,
    DeviceGraphStrategy,
    EagerStrategy,
    GraphSupport,
    hookimpl,
)
from paged_core.cli.main import main
from paged_core.registry import BackendRegistry, PluginSource


def _backend(name: str, device: str, strategy: object) -> type[AttentionBackend]:
    """A loaded fake declaring uniform-decode capture on ``device`` whose ``graph_strategy()`` returns ``strategy``."""

    def fail(self: object, *args: object) -> None:
        raise AssertionError("kernels must not run")

    def init(self: AttentionBackend, device: object = None) -> None:
        raise AssertionError("listing must not run the constructor (it may load kernels)")

    return type(
        f"Graph_{name}",
        (AttentionBackend,),
        {
            "name": name,
            "api_version": 1,
            "__init__": init,
            "availability": classmethod(lambda cls: Availability(True, "", device)),
            "capabilities": classmethod(
                lambda cls: BackendCapabilities(
                    dtypes=frozenset({torch.float32}), block_sizes=(16,), graph_support=GraphSupport.UNIFORM_DECODE
                )
            ),
            "graph_strategy": lambda self: strategy() if callable(strategy) else strategy,
            "write_kv": fail,
            "attention": fail,
            "copy_blocks": fail,
        },
    )


@pytest.fixture
def graph_registry(monkeypatch: pytest.MonkeyPatch) -> BackendRegistry:
    module = types.ModuleType("cli_fake_graphs")
    module.paged_register_backends = hookimpl(  # type: ignore[attr-defined]
        lambda: [
            _backend("nostrategy", "cpu", None),
            _backend("eagergpu", "cuda", EagerStrategy),
            _backend("graphsgpu", "cuda", lambda: DeviceGraphStrategy("cuda")),
            _backend("eagercpu", "cpu", EagerStrategy),
        ]
    )
    monkeypatch.setitem(sys.modules, "cli_fake_graphs", module)
    registry = BackendRegistry.from_entry_points(
        [PluginSource("graphs", "cli_fake_graphs", "paged-backend-graphs", "1.0")], builtins={}
    )
    monkeypatch.setattr(backends_cli, "load_registry", lambda: registry)
    return registry


def test_json_names_the_unusable_strategies(
    graph_registry: BackendRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backends", "--json"]) == 0
    rows = {d["name"]: d for d in json.loads(capsys.readouterr().out)["backends"]}
    assert rows["nostrategy"]["graph_problem"] == (
        "backend 'nostrategy' declares graph_support=uniform_decode but graph_strategy() returned NoneType, "
        "not a GraphCaptureStrategy"
    )
    assert "returns EagerStrategy on cuda, which captures nothing" in rows["eagergpu"]["graph_problem"]
    # Device graphs on a GPU, and eager replay on a CPU (no graph API: the test seam), are fine.
    assert rows["graphsgpu"]["graph_problem"] is None and rows["eagercpu"]["graph_problem"] is None


def test_table_shows_the_problem_in_the_reason(
    graph_registry: BackendRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "graph_strategy() returned NoneType, not a GraphCaptureStrategy" in out
    assert "returns EagerStrategy on cuda, which captures nothing" in out
