"""Whether a backend's ``graph_strategy()`` can serve the capture its capabilities declare.

A backend declaring ``graph_support`` other than ``never`` promises that the
engine may capture its batches; the strategy it returns is how. The engine
(graph modes), ``paged backends`` and ``paged-conformance`` all ask here, so
they agree on what counts as unusable:

* ``graph_strategy()`` raises, or returns something that is not a
  :class:`~paged_core.contract.graph_strategy.GraphCaptureStrategy` (``None``);
* it returns :class:`~paged_core.contract.graph_strategy.EagerStrategy` on a
  device that has device graphs (CUDA/HIP, XPU): nothing would be captured.

:class:`EagerStrategy` on a device without a graph API (a CPU, an
interpreter) is the documented test seam and not a problem.
"""

from __future__ import annotations

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import GraphSupport
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy

GRAPH_DEVICE_TYPES = frozenset({"cuda", "xpu"})
"""Device types whose torch module has a graph API (ROCm builds use the ``cuda`` names)."""


def backend_strategy(backend: AttentionBackend) -> tuple[GraphCaptureStrategy | None, str | None]:
    """``backend.graph_strategy()`` and ``None``, or ``None`` and why it cannot serve the declared capture.

    A backend declaring ``graph_support=never`` gets ``(None, None)``: it captures nothing, by declaration.
    """
    support = backend.capabilities().graph_support
    if support == GraphSupport.NEVER:
        return None, None
    declared = f"backend {backend.name!r} declares graph_support={support.name.lower()}"
    try:
        strategy = backend.graph_strategy()
    except Exception as exc:  # a vendor's code: report it, never crash the listing or the engine's start
        return None, f"{declared} but graph_strategy() raised {type(exc).__name__}: {exc}"
    if not isinstance(strategy, GraphCaptureStrategy):
        return None, f"{declared} but graph_strategy() returned {type(strategy).__name__}, not a GraphCaptureStrategy"
    if isinstance(strategy, EagerStrategy) and backend.device.type in GRAPH_DEVICE_TYPES:
        return None, (
            f"{declared} but graph_strategy() returns {type(strategy).__name__} on {backend.device}, "
            "which captures nothing"
        )
    return strategy, None


def strategy_problem(backend: AttentionBackend) -> str | None:
    """Why ``backend`` declares capture without a usable strategy, or ``None`` when nothing is wrong."""
    return backend_strategy(backend)[1]
