"""Graph-capture stand-ins for a machine without device graphs: a strategy that records, a backend that captures.

Device graphs need a GPU, but everything around the capture (static buffers, padding to a capture size,
frozen host ints, pieces, dispatch, fallback, counters) is the core's, so the e2e tests run it here with a
strategy whose replay calls the captured step again on its static arguments.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable

import torch

from paged_core.api import BackendCapabilities, GraphCaptureStrategy, GraphSupport, StepFn
from paged_core.reference.backend import ReferenceBackend


class RecordingStrategy(GraphCaptureStrategy):
    """Capture stores the step and its static arguments; replay calls it again on them. Counts both.

    ``fail_on`` makes ``capture`` or ``replay`` raise instead, as a broken vendor strategy would.
    """

    name = "recording"

    def __init__(self, fail_on: str = "") -> None:
        self.steps: dict[Hashable, tuple[StepFn, tuple[torch.Tensor, ...]]] = {}
        self.calls: Counter[str] = Counter()
        self.fail_on = fail_on

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        self.calls["capture"] += 1
        if self.fail_on == "capture":
            raise RuntimeError("capture failed on purpose")
        self.steps[key] = (fn, args)

    def replay(self, key: Hashable) -> torch.Tensor:
        self.calls["replay"] += 1
        if self.fail_on == "replay":
            raise RuntimeError("replay failed on purpose")
        fn, args = self.steps[key]
        return fn(*args)

    def has(self, key: Hashable) -> bool:
        return key in self.steps

    def reset(self) -> None:
        self.steps.clear()


class CapturingReference(ReferenceBackend):
    """The reference kernels, declared capturable for uniform decode (its host reads are fine when replay is eager)."""

    name = "reference-capture"

    def __init__(self, strategy: RecordingStrategy, device: str = "cpu") -> None:
        super().__init__(device=device)
        self.strategy = strategy

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return dataclasses.replace(ReferenceBackend.capabilities(), graph_support=GraphSupport.UNIFORM_DECODE)

    def graph_strategy(self) -> GraphCaptureStrategy:
        return self.strategy
