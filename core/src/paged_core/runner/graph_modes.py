"""Which graph mode runs on a backend, and which of the backend's strategies each mode takes."""

from __future__ import annotations

from paged_core.config import GRAPH_MODES
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import GraphSupport
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy
from paged_core.errors import ConfigError, UnsupportedConfigError
from paged_core.graph import CompiledStrategy, DeviceGraphStrategy, backend_strategy
from paged_core.graph.device_strategy import graph_module
from paged_core.runner.piece_graphs import piece_refusal


def device_graph_refusal(backend: AttentionBackend) -> str | None:
    """Why ``graph_mode='device'`` cannot run on this backend and device, or ``None`` when it can.

    ``device`` runs the backend's own ``graph_strategy()``: it needs declared
    capture, a usable strategy (see :mod:`paged_core.graph.strategy_check`)
    that captures something, and for the built-in device graphs a device with
    a graph API. A vendor's own strategy is trusted to know its device.
    """
    strategy, problem = backend_strategy(backend)
    if problem is not None:
        return problem
    if strategy is None:
        return f"backend {backend.name!r} declares graph_support=never"
    if isinstance(strategy, EagerStrategy):
        return f"backend {backend.name!r} returns {type(strategy).__name__} on {backend.device}: nothing to capture"
    if isinstance(strategy, DeviceGraphStrategy):
        try:
            graph_module(backend.device.type)
        except UnsupportedConfigError as exc:
            return f"device {backend.device}: {exc}"
    return None


def _has_device_graphs(backend: AttentionBackend) -> bool:
    try:
        graph_module(backend.device.type)
    except UnsupportedConfigError:
        return False
    return True


def resolve_graph_mode(mode: str, backend: AttentionBackend) -> str:
    """The concrete mode for ``mode`` on ``backend``; refuses an unknown or impossible one with the working modes.

    ``auto`` is ``device`` where the backend's strategy can run and the device has
    device graphs, else ``eager`` (on CPUs the fused eager step beat compilation).
    """
    if mode not in GRAPH_MODES:
        raise ConfigError(f"graph_mode must be one of {', '.join(GRAPH_MODES)}; got {mode!r}")
    refusal = device_graph_refusal(backend)
    if mode == "device" and refusal is not None:
        raise UnsupportedConfigError(f"graph_mode='device' refused: {refusal}; modes that work here: eager, compiled")
    if mode == "auto":
        return "device" if refusal is None and _has_device_graphs(backend) else "eager"
    return mode


def device_strategy(backend: AttentionBackend) -> GraphCaptureStrategy:
    """The strategy ``device`` mode captures with: the backend's (refused earlier when unusable)."""
    strategy, problem = backend_strategy(backend)
    if strategy is None:
        raise UnsupportedConfigError(f"graph_mode='device' refused: {problem or 'no capture declared'}")
    return strategy


def compiled_strategy(backend: AttentionBackend) -> CompiledStrategy | None:
    """The backend's strategy when it compiles (``compiled`` mode routes admitted batches through it), else None."""
    strategy, _ = backend_strategy(backend)
    return strategy if isinstance(strategy, CompiledStrategy) else None


def resolve_piecewise(piecewise: bool | None, mode: str, backend: AttentionBackend, forward: object) -> bool:
    """Whether steps that whole-step graphs do not hold run as captured or compiled pieces in ``mode`` (resolved).

    ``None`` (auto) is what was measured to pay: on for device graphs of a backend capturing uniform decode
    only (the built-in device-graph strategy: on an H200, mean inter-token latency 7.6 ms against 14.2 ms with
    mixed steps eager; see the README's Performance section), and for ``compiled`` on a backend whose attention
    cannot be traced (the pieces are then the whole compiled step: 1.06x the whole-step compile on
    ``throughput`` 64); off otherwise (a backend capturing any batch keeps whole-step graphs: p99 12.4 ms
    against the pieces' 24.7 ms). ``True`` where pieces cannot run is refused with the reason.
    """
    refusal = piece_refusal(forward)
    if piecewise is True:
        if mode not in ("compiled", "device"):
            raise UnsupportedConfigError(f"piecewise capture needs graph_mode compiled or device, not {mode!r}")
        if refusal is not None:
            raise UnsupportedConfigError(f"piecewise=True refused: {refusal}")
        return True
    if piecewise is False or refusal is not None:
        return False
    support = type(backend).capabilities().graph_support
    if mode == "device":
        strategy, _ = backend_strategy(backend)
        return support == GraphSupport.UNIFORM_DECODE and isinstance(strategy, DeviceGraphStrategy)
    return mode == "compiled" and support == GraphSupport.NEVER
