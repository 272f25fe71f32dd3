"""Compiled steps: ``torch.compile`` once per key, with static shapes."""

from __future__ import annotations

import types
from collections.abc import Callable, Hashable
from typing import Any

import torch

from paged_core.contract.graph_strategy import GraphCaptureStrategy, StepFn
from paged_core.errors import ConfigError


def _own_code(fn: StepFn, tag: str) -> StepFn:
    """A trampoline to ``fn`` with a code object of its own.

    Dynamo keeps its compile cache on the code object and stops recompiling
    after a small limit; giving every key a distinct code object gives every
    key its own cache, so a long list of capture sizes never silently falls
    back to eager.
    """

    def trampoline(*args: torch.Tensor) -> torch.Tensor:
        return fn(*args)

    names: dict[str, Any] = {"co_name": f"paged_step_{tag}"}
    if hasattr(trampoline.__code__, "co_qualname"):  # Python >= 3.11
        names["co_qualname"] = names["co_name"]
    code = trampoline.__code__.replace(**names)
    return types.FunctionType(code, trampoline.__globals__, code.co_name, None, trampoline.__closure__)


class CompiledStrategy(GraphCaptureStrategy):
    """``torch.compile(fn, dynamic=False, fullgraph=False)`` per key; capture compiles, replay runs it.

    ``backend`` is any ``torch.compile`` backend: ``"inductor"`` (default)
    for real use, ``"eager"`` or ``"aot_eager"`` to check tracing cheaply.
    ``fullgraph=False`` tolerates graph breaks (they cost speed, not
    correctness). Capture runs the compiled function once so compilation
    happens at capture time, not on the first real step.
    """

    name = "compiled"

    def __init__(
        self,
        backend: str | Callable[..., Any] = "inductor",
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if mode is not None and options is not None:
            raise ConfigError("torch.compile accepts either mode or options, not both")
        self.backend = backend
        self.mode = mode
        self.options = options
        self._compiled: dict[Hashable, tuple[StepFn, tuple[torch.Tensor, ...]]] = {}

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        """Compile ``fn`` for ``args``' exact shapes and run it once to trigger compilation."""
        if key in self._compiled:
            raise ConfigError(f"key {key!r} is already captured; reset() first")
        compiled = torch.compile(
            _own_code(fn, str(len(self._compiled))),
            backend=self.backend,
            mode=self.mode,
            options=self.options,
            dynamic=False,
            fullgraph=False,
        )
        compiled(*args)
        self._compiled[key] = (compiled, args)

    def replay(self, key: Hashable) -> torch.Tensor:
        """Run the compiled function for ``key`` on its captured argument tensors."""
        try:
            compiled, args = self._compiled[key]
        except KeyError:
            raise ConfigError(f"no compiled step for key {key!r}") from None
        return compiled(*args)

    def has(self, key: Hashable) -> bool:
        """Whether ``key`` was captured."""
        return key in self._compiled

    def reset(self) -> None:
        """Forget every compiled function."""
        self._compiled.clear()
