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


class _GoneStore:
    """A store whose host has gone: every call fails."""

    def add(self, key: str, amount: int) -> int:
        raise RuntimeError("Failed to recv, got 0 bytes")

    def set(self, key: str, value: bytes) -> None:
        raise RuntimeError("Broken pipe")


class _ByeStore(_Store):
    def __init__(self) -> None:
        super().__init__()
        self.keys: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.keys[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)


def test_a_beat_into_a_gone_store_says_so_instead_of_raising() -> None:
    assert hb.Heart(_Store(), 1).beat() is True
    assert hb.Heart(_GoneStore(), 1).beat() is False


def test_rank_0_waits_for_every_bye_and_names_the_ranks_that_never_said_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(hb.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hb.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    store = _ByeStore()
    hb.say_bye(store, 1)
    hb.say_bye(_GoneStore(), 2)  # rank 0 already gone: the bye is dropped, nothing raised
    assert hb.wait_for_byes(store, [1], timeout=2.0) == []
    assert clock[0] == 0.0  # answered at once
    assert hb.wait_for_byes(store, [1, 2], timeout=2.0) == [2]
    assert 2.0 <= clock[0] < 2.1  # gave up after the timeout
