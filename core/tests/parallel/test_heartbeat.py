"""Heartbeats: a worker's counter moves; rank 0 names the rank whose counter stood still past the timeout."""

from __future__ import annotations

import pytest

import paged_core.parallel.heartbeat as hb


class _Store:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]


def test_a_silent_rank_is_named_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(hb.time, "monotonic", lambda: clock[0])
    store = _Store()
    heart, pulse = hb.Heart(store, 1), hb.Pulse(store, [1], timeout=3.0)
    for _ in range(10):  # beating every 0.5 s: never silent
        heart.beat()
        clock[0] += 0.5
        assert pulse.silent() is None
    heart.beat()
    assert store.values["paged/beat/1"] == 11
    heart.beat()  # within the interval: the store is not touched
    assert store.values["paged/beat/1"] == 11
    clock[0] += 2.0
    assert pulse.silent() is None  # rank 0 sees the last beat now, and counts from here by its own clock
    clock[0] += 2.0
    assert pulse.silent() is None  # 2 s < 3 s
    clock[0] += 2.0
    why = pulse.silent()
    assert why is not None and "worker rank 1 stopped answering: no heartbeat for 4 s" in why


def test_nothing_is_watched_without_remote_ranks() -> None:
    assert hb.Pulse(_Store(), [], timeout=1.0).silent() is None
