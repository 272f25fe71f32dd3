"""What the trace checks share: a fresh entry point per compilation, and a recorder of host reads.

A device graph records kernels, not Python: a step that reads a tensor on
the host (``.item()``, ``.tolist()``, ``int()``, a branch on a value) runs
fine eagerly, but a captured graph freezes the capture-time value.
``torch.compile(fullgraph=True)`` turns every such read that steers the
computation into an error, with no device needed; :class:`HostReads` also
catches reads whose result the compiler would drop as dead code.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from torch.overrides import TorchFunctionMode

_TAGS = itertools.count()
F = TypeVar("F", bound=Callable[..., Any])


class HostReads(TorchFunctionMode):
    """Records every tensor-to-Python conversion made while active (each one a device sync)."""

    READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        type_list: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def own_entry(fn: F) -> F:
    """Call ``fn`` through a function with a code object of its own.

    The compiler caches per code object and gives up after a few
    recompilations; every check (many backends may be checked in one
    process) gets a fresh entry so it is really traced.
    """

    def entry(*args: Any) -> Any:
        return fn(*args)

    code = entry.__code__.replace(co_name=f"paged_conformance_trace_{next(_TAGS)}")
    made = types.FunctionType(code, entry.__globals__, code.co_name, None, entry.__closure__)
    return made  # type: ignore[return-value]


def first_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (compiler errors run to pages)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]
    return f"{type(exc).__name__}: {first}"
