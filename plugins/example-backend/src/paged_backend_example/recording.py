"""The example's capture strategy: the core's ``CompiledStrategy``, counting every capture and replay.

A vendor copying the template gets a strategy whose use is visible: the
backend keeps one :class:`GraphCalls` for every strategy it hands out, so a
test (or a curious operator) can see the engine capture sizes at start and
replay them while serving. Counts are per size, so memory stays bounded in a
long-running server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from paged_core.api import CompiledStrategy, StepFn


@dataclass
class GraphCalls:
    """How often each captured key (a padded token count) was captured and replayed."""

    captures: Counter[Hashable] = field(default_factory=Counter)
    replays: Counter[Hashable] = field(default_factory=Counter)


class RecordingCompiledStrategy(CompiledStrategy):
    """:class:`CompiledStrategy` that counts its calls in ``calls`` (shared with the backend that made it)."""

    def __init__(self, calls: GraphCalls, backend: str | Callable[..., Any] = "inductor") -> None:
        super().__init__(backend=backend)
        self.calls = calls

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        """Compile ``fn`` for ``key`` (see :class:`CompiledStrategy`), counting the capture."""
        self.calls.captures[key] += 1
        super().capture(key, fn, args)

    def replay(self, key: Hashable) -> torch.Tensor:
        """Run the compiled step for ``key``, counting the replay."""
        self.calls.replays[key] += 1
        return super().replay(key)
