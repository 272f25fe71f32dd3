"""Graph capture owned by the core: size policy, static buffers, dispatch, and the built-in strategies."""

from __future__ import annotations

from paged_core.graph.capture_sizes import capture_sizes, padded_size
from paged_core.graph.compiled_strategy import CompiledStrategy
from paged_core.graph.device_strategy import DeviceGraphStrategy
from paged_core.graph.runner import GraphRunner, GraphStats, Replay
from paged_core.graph.static_batch import StaticBatch, StaticInput
from paged_core.graph.strategy_check import backend_strategy, strategy_problem

__all__ = [
    "CompiledStrategy",
    "DeviceGraphStrategy",
    "GraphRunner",
    "GraphStats",
    "Replay",
    "StaticBatch",
    "StaticInput",
    "backend_strategy",
    "capture_sizes",
    "padded_size",
    "strategy_problem",
]
