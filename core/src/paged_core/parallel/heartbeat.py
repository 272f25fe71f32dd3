"""Liveness of ranks rank 0 cannot watch as processes (``env`` launches on other machines).

A worker bumps a counter in the rendezvous store at most every :data:`BEAT_INTERVAL` seconds, from
its idle poll and after its steps. Rank 0 reads the counters (at most once a second) and, by its own
clock (so the machines' clocks never matter), reports a rank whose counter has not moved for longer
than ``distributed_timeout``: the front end then learns of a dead remote worker while the engine is
idle, not only when the next step's collective fails.

Shutdown is a handshake, so that no rank touches the store after its host is gone: rank 0 says quit
on the plan channel; each worker stops its heart and :func:`say_bye` (its last store write); rank 0
waits for every bye (:func:`wait_for_byes`), or its local workers' exits, before it leaves the group.
"""

from __future__ import annotations

import time
from typing import Any

BEAT_INTERVAL = 0.5
CHECK_INTERVAL = 1.0


def _key(rank: int) -> str:
    return f"paged/beat/{rank}"


def _bye_key(rank: int) -> str:
    return f"paged/bye/{rank}"


class Heart:
    """A worker's side: :meth:`beat` often; it touches the store only every :data:`BEAT_INTERVAL` seconds."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store, self.key, self.last = store, _key(rank), 0.0

    def beat(self) -> bool:
        """Bump the counter if it is time; False when the store did not answer (its host, rank 0, is gone)."""
        now = time.monotonic()
        if now - self.last >= BEAT_INTERVAL:
            try:
                self.store.add(self.key, 1)
            except Exception:  # the store's own error types vary by torch version; any failure means it is gone
                return False
            self.last = now
        return True


def say_bye(store: Any, rank: int) -> None:
    """A worker's last store write, after its heart has stopped: rank 0 may take the store down now."""
    try:
        store.set(_bye_key(rank), b"1")
    except Exception:  # rank 0 already gone: nobody waits for the bye
        pass


def wait_for_byes(store: Any, ranks: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for every rank of ``ranks`` to say bye; the ranks that did not."""
    keys = {rank: _bye_key(rank) for rank in ranks}
    deadline = time.monotonic() + timeout
    while True:
        silent = [rank for rank, key in keys.items() if not store.check([key])]
        if not silent or time.monotonic() >= deadline:
            return silent
        time.sleep(0.02)


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
                return (
                    f"tensor-parallel worker rank {rank} stopped answering: no heartbeat for "
                    f"{now - since:.0f} s (distributed_timeout {self.timeout:.0f} s; its machine or process "
                    "is gone or stalled)"
                )
        return None
