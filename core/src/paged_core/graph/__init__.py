"""Graph capture owned by the core: size policy, static buffers, dispatch, and the built-in strategies."""

from __future__ import annotations

from paged_core.graph.capture_sizes import capture_sizes, padded_size
from paged_core.graph.compiled_strategy import CompiledStrategy
from paged_core.graph.device_strategy import DeviceGraphStrategy
from paged_core.graph.runner import GraphRunner, GraphStats
from paged_core.graph.static_batch import StaticBatch, StaticInput

__all__ = [
    "CompiledStrategy",
    "DeviceGraphStrategy",
    "GraphRunner",
    "GraphStats",
    "StaticBatch",
    "StaticInput",
    "capture_sizes",
    "padded_size",
]
