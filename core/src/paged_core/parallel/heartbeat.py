"""Liveness of ranks rank 0 cannot watch as processes (``env`` launches on other machines).

A worker bumps a counter in the rendezvous store at most every :data:`BEAT_INTERVAL` seconds, from
its idle poll and after its steps. Rank 0 reads the counters (at most once a second) and, by its own
clock (so the machines' clocks never matter), reports a rank whose counter has not moved for longer
than ``distributed_timeout``: the front end then learns of a dead remote worker while the engine is
idle, not only when the next step's collective fails.
"""

from __future__ import annotations

import time
from typing import Any

BEAT_INTERVAL = 0.5
CHECK_INTERVAL = 1.0


def _key(rank: int) -> str:
    return f"paged/beat/{rank}"


class Heart:
    """A worker's side: :meth:`beat` often; it touches the store only every :data:`BEAT_INTERVAL` seconds."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store, self.key, self.last = store, _key(rank), 0.0

    def beat(self) -> None:
        now = time.monotonic()
        if now - self.last >= BEAT_INTERVAL:
            self.store.add(self.key, 1)
            self.last = now


class Pulse:
    """Rank 0's side: which watched rank went silent for longer than ``timeout`` seconds."""

    def __init__(self, store: Any, ranks: list[int], timeout: float) -> None:
        now = time.monotonic()
        self.store, self.timeout = store, timeout
        self.seen = {r: (-1, now) for r in ranks}
        self.checked = 0.0

    def silent(self) -> str | None:
        """``None`` while every watched rank beats; else which one stopped, and for how long."""
        now = time.monotonic()
        if not self.seen or now - self.checked < CHECK_INTERVAL:
            return None
        self.checked = now
        for rank, (count, since) in self.seen.items():
            value = int(self.store.add(_key(rank), 0))
            if value != count:
                self.seen[rank] = (value, now)
            elif now - since > self.timeout:
                return (f"tensor-parallel worker rank {rank} stopped answering: no heartbeat for "
                        f"{now - since:.0f} s (distributed_timeout {self.timeout:.0f} s; its machine or process "
                        "is gone or stalled)")  # fmt: skip
        return None
