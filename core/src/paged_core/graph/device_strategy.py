"""Device graphs: ``torch.cuda.CUDAGraph`` (CUDA and HIP builds) and ``torch.xpu.XPUGraph``."""

from __future__ import annotations

from collections.abc import Hashable
from types import ModuleType
from typing import Any, cast

import torch

from paged_core.contract.graph_strategy import GraphCaptureStrategy, StepFn
from paged_core.errors import ConfigError, UnsupportedConfigError

# ROCm builds of torch expose HIP graphs through the ``torch.cuda`` names, so "cuda" covers both.
_GRAPH_CLASS = {"cuda": "CUDAGraph", "xpu": "XPUGraph"}


def graph_module(device_type: str) -> ModuleType:
    """The torch device module (``torch.cuda`` or ``torch.xpu``) whose graph API serves ``device_type``.

    Raises :class:`UnsupportedConfigError` when the device type has no graph
    API in this torch build, or when no such device is present.
    """
    if device_type not in _GRAPH_CLASS:
        raise UnsupportedConfigError(
            f"device type {device_type!r} has no graph API (device graphs support: {sorted(_GRAPH_CLASS)})"
        )
    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, _GRAPH_CLASS[device_type]) or not hasattr(module, "graph"):
        raise UnsupportedConfigError(f"this torch build has no torch.{device_type}.{_GRAPH_CLASS[device_type]}")
    if not module.is_available():
        raise UnsupportedConfigError(f"torch.{device_type} reports no available device")
    return cast(ModuleType, module)


class DeviceGraphStrategy(GraphCaptureStrategy):
    """Captures each step as a device graph; all graphs share one memory pool.

    The device type comes from ``device_type`` or, when omitted, from the
    captured arguments. Capture follows torch's documented recipe: a few
    eager iterations on a side stream (so lazy initialisation and allocator
    warm-up are not recorded), then the recording inside ``torch.<dev>.graph``,
    which itself captures on a side stream. The pool is shared across keys
    because graphs of one runner never replay concurrently; capturing the
    largest size first (as :class:`~paged_core.graph.runner.GraphRunner`
    does) lets smaller graphs reuse its blocks.
    """

    name = "device_graph"

    def __init__(self, device_type: str | None = None, warmup_iters: int = 1) -> None:
        if device_type is not None and device_type not in _GRAPH_CLASS:
            raise UnsupportedConfigError(
                f"device type {device_type!r} has no graph API (device graphs support: {sorted(_GRAPH_CLASS)})"
            )
        if warmup_iters < 0:
            raise ConfigError(f"warmup_iters must be >= 0, got {warmup_iters}")
        self.device_type = device_type
        self.warmup_iters = warmup_iters
        self._pool: Any = None
        self._graphs: dict[Hashable, tuple[Any, torch.Tensor]] = {}

    def _device_of(self, args: tuple[torch.Tensor, ...]) -> torch.device:
        """The single device the arguments live on, checked against ``device_type``."""
        devices = {a.device for a in args}
        if len(devices) != 1:
            raise UnsupportedConfigError(f"captured arguments must share one device, got {sorted(map(str, devices))}")
        device = devices.pop()
        if self.device_type is not None and device.type != self.device_type:
            raise UnsupportedConfigError(f"DeviceGraphStrategy({self.device_type!r}) was given tensors on {device}")
        return device

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        """Warm ``fn`` up on a side stream, then record ``fn(*args)`` as a graph under ``key``."""
        if not args:
            raise UnsupportedConfigError("DeviceGraphStrategy needs at least one tensor argument to find the device")
        device = self._device_of(args)
        module = graph_module(device.type)
        if key in self._graphs:
            raise ConfigError(f"graph key {key!r} is already captured; reset() first")
        with module.device(device):
            if self._pool is None:
                self._pool = module.graph_pool_handle()
            side = module.Stream()
            side.wait_stream(module.current_stream())
            with module.stream(side):
                for _ in range(self.warmup_iters):
                    fn(*args)
            module.current_stream().wait_stream(side)
            graph = getattr(module, _GRAPH_CLASS[device.type])()
            with module.graph(graph, pool=self._pool):
                output = fn(*args)
        self._graphs[key] = (graph, output)

    def replay(self, key: Hashable) -> torch.Tensor:
        """Replay the graph for ``key``; returns its static output tensor (overwritten by the next replay)."""
        try:
            graph, output = self._graphs[key]
        except KeyError:
            raise ConfigError(f"no graph captured for key {key!r}") from None
        graph.replay()
        return output

    def has(self, key: Hashable) -> bool:
        """Whether ``key`` was captured."""
        return key in self._graphs

    def reset(self) -> None:
        """Drop every graph and the shared pool (its memory returns once nothing references it)."""
        for graph, _ in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._pool = None
