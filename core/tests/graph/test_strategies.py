"""The built-in capture strategies: device graphs (bookkeeping only, no GPU here) and compiled."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from paged_core.api import ConfigError, UnsupportedConfigError
from paged_core.graph import CompiledStrategy, DeviceGraphStrategy, device_strategy


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_device_graphs_refuse_cpu_tensors() -> None:
    strategy = DeviceGraphStrategy()
    with pytest.raises(UnsupportedConfigError, match="'cpu' has no graph API"):
        strategy.capture(1, double, (torch.ones(2),))
    assert not strategy.has(1)


def test_device_graphs_refuse_unknown_types_and_mismatches() -> None:
    with pytest.raises(UnsupportedConfigError, match="'mps' has no graph API"):
        DeviceGraphStrategy("mps")
    with pytest.raises(UnsupportedConfigError, match="given tensors on cpu"):
        DeviceGraphStrategy("cuda").capture(1, double, (torch.ones(2),))
    with pytest.raises(UnsupportedConfigError, match="at least one tensor"):
        DeviceGraphStrategy().capture(1, double, ())
    if not torch.cuda.is_available():
        with pytest.raises(UnsupportedConfigError, match="no available device"):
            device_strategy.graph_module("cuda")


class FakeGraph:
    """Stands in for CUDAGraph: replay only logs (the output tensor is whatever capture produced)."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.reset_called = log, False

    def replay(self) -> None:
        self.log.append("replay")

    def reset(self) -> None:
        self.reset_called = True


class FakeModule:
    """Stands in for torch.cuda: streams are no-ops, ``graph`` records the body as a re-runnable closure."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.pools = 0
        self.graphs: list[FakeGraph] = []

    def device(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def graph_pool_handle(self) -> str:
        self.pools += 1
        return f"pool{self.pools}"

    def Stream(self) -> Any:
        return type("S", (), {"wait_stream": lambda self, other: None})()

    def current_stream(self) -> Any:
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s: Any) -> Iterator[None]:
        self.log.append("side-stream")
        yield

    def CUDAGraph(self) -> FakeGraph:
        graph = FakeGraph(self.log)
        self.graphs.append(graph)
        return graph

    @contextlib.contextmanager
    def graph(self, g: FakeGraph, pool: str) -> Iterator[None]:
        self.log.append(f"capture:{pool}")
        yield


def test_device_graph_bookkeeping_with_a_fake_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeModule()
    monkeypatch.setattr(device_strategy, "graph_module", lambda device_type: fake)
    monkeypatch.setattr(device_strategy, "_GRAPH_CLASS", {"cpu": "CUDAGraph"})
    strategy = DeviceGraphStrategy(warmup_iters=2)
    x = torch.ones(3)
    strategy.capture(8, double, (x,))
    strategy.capture(4, double, (x[:2],))
    assert fake.pools == 1, "one memory pool shared by every capture"
    assert fake.log == ["side-stream", "capture:pool1", "side-stream", "capture:pool1"]
    assert strategy.has(8) and strategy.has(4) and not strategy.has(2)
    assert torch.equal(strategy.replay(8), torch.full((3,), 3.0))  # the output recorded at capture
    assert fake.log[-1] == "replay"
    with pytest.raises(ConfigError, match="already captured"):
        strategy.capture(8, double, (x,))
    strategy.reset()
    assert all(gr.reset_called for gr in fake.graphs) and not strategy.has(8)
    with pytest.raises(ConfigError, match="no graph captured"):
        strategy.replay(8)
    strategy.capture(8, double, (x,))
    assert fake.pools == 2, "reset drops the pool"


def test_compiled_strategy_compiles_each_key_once_even_past_the_recompile_limit() -> None:
    compiles: list[tuple[int, ...]] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        compiles.append(tuple(example_inputs[0].shape))
        return gm.forward

    strategy = CompiledStrategy(backend=counting_backend)
    buf = torch.arange(20, dtype=torch.float32)
    for n in range(1, 13):  # 12 static shapes: more than dynamo's default per-code recompile limit of 8
        strategy.capture(n, double, (buf[:n],))
    assert sorted(compiles) == [(n,) for n in range(1, 13)]
    buf += 1  # replays read the captured tensors' current contents
    for n in range(1, 13):
        assert torch.equal(strategy.replay(n), buf[:n] * 2 + 1)
    assert len(compiles) == 12, "replay must not recompile"
    strategy.reset()
    assert not strategy.has(1)
    with pytest.raises(ConfigError, match="no compiled step"):
        strategy.replay(1)


def test_compiled_strategy_with_inductor() -> None:
    strategy = CompiledStrategy()  # the default: inductor
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    strategy.capture("k", lambda a, b: torch.softmax(a @ b, dim=-1), (x, w))
    x.copy_(torch.randn(4, 8))
    torch.testing.assert_close(strategy.replay("k"), torch.softmax(x @ w, dim=-1))


def test_compiled_strategy_option_errors() -> None:
    with pytest.raises(ConfigError, match="mode or options"):
        CompiledStrategy(mode="reduce-overhead", options={"trace.enabled": False})
