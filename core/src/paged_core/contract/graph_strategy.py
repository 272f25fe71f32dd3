"""The graph-capture strategy a backend supplies; the core owns when and what to capture."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from typing import ClassVar

import torch

StepFn = Callable[..., torch.Tensor]
"""A step over static buffers: reads only its tensor arguments, returns one tensor."""


class GraphCaptureStrategy(ABC):
    """Captures a step function once per key and replays it.

    The core's graph runner allocates static argument tensors, warms the
    function up, calls :meth:`capture` once per captured size, and before each
    :meth:`replay` copies the new batch into those same tensors. A strategy
    must therefore read its inputs only from the captured ``args``.

    The engine asks ``backend.graph_strategy()`` for the strategy of its graph
    modes, and the backend's declared ``graph_support`` decides which batches
    reach it. An exception from :meth:`capture` or :meth:`replay` does not fail
    a request: that size runs through the engine's fallback from then on,
    counted under the reason (``graph strategy replay raised ...``).
    """

    name: ClassVar[str]

    @abstractmethod
    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        """Record ``fn(*args)`` under ``key``."""

    @abstractmethod
    def replay(self, key: Hashable) -> torch.Tensor:
        """Run the recording for ``key``; returns the output tensor (may be a static buffer)."""

    @abstractmethod
    def has(self, key: Hashable) -> bool:
        """Whether ``key`` was captured."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every recording (and the memory it holds)."""


class EagerStrategy(GraphCaptureStrategy):
    """No capture: replay simply calls the function again."""

    name = "eager"

    def __init__(self) -> None:
        self._steps: dict[Hashable, tuple[StepFn, tuple[torch.Tensor, ...]]] = {}

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        self._steps[key] = (fn, args)

    def replay(self, key: Hashable) -> torch.Tensor:
        fn, args = self._steps[key]
        return fn(*args)

    def has(self, key: Hashable) -> bool:
        return key in self._steps

    def reset(self) -> None:
        self._steps.clear()
