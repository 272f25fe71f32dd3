"""EngineStats: a snapshot of the engine's gauges, taken on the engine thread and read by /metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineStats:
    """KV-cache, queue and prefix-cache figures at one moment (prefix figures in tokens)."""

    kv_usage: float = 0.0
    num_free_blocks: int = 0
    num_usable_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    steps: int = 0
    graph_mode: str = "eager"
    graph_replays: int = 0
    """Steps run as a compiled or captured graph."""
    eager_steps: int = 0
    """Steps run eagerly (every step in eager mode; fallbacks otherwise)."""
    graph_fallbacks: dict[str, int] = field(default_factory=dict)
    """Eager fallbacks of a graph mode, by reason."""


def snapshot(engine: Any, steps: int) -> EngineStats:
    """Read ``engine``'s scheduler; call only from the thread that steps the engine."""
    sched = engine.scheduler
    pool = sched.kv.pool
    stats = sched.kv.stats
    executor = engine.runner.executor
    return EngineStats(
        kv_usage=float(pool.usage),
        num_free_blocks=int(pool.num_free_blocks),
        num_usable_blocks=int(pool.num_usable_blocks),
        num_running=int(sched.num_running),
        num_waiting=int(sched.num_waiting),
        num_preemptions=int(sched.num_preemptions),
        prefix_queries=int(stats.queries),
        prefix_hits=int(stats.hits),
        steps=steps,
        graph_mode=executor.mode,
        graph_replays=int(executor.stats.replays),
        eager_steps=int(executor.stats.eager_steps),
        graph_fallbacks=dict(executor.stats.fallback_reasons),
    )
