"""The data-parallel router alone: least-loaded placement, prefix affinity and when it yields, abort routing."""

from __future__ import annotations

import pytest

from paged_core.clients.dp_router import AFFINITY_SLACK, MAX_AFFINITY_BLOCKS, Router, prefix_keys
from paged_core.engine_core.messages import CoreAbort, SchedulerStats
from paged_core.errors import EngineDeadError

BS = 4
SHARED = list(range(100, 100 + 6 * BS))  # six full blocks


def stats(running: int = 0, waiting: int = 0, free: int = 100) -> SchedulerStats:
    return SchedulerStats(num_running=running, num_waiting=waiting, num_free_blocks=free, num_usable_blocks=100)


def router(cores: int = 2) -> Router:
    r = Router(cores, BS)
    for i in range(cores):
        r.note_stats(i, stats())
    return r


def test_prefix_keys_chain_over_full_blocks_and_the_salt() -> None:
    keys = prefix_keys([*SHARED, 1, 2], BS, None)
    assert len(keys) == 6  # the partial last block is not keyed: the prefix cache holds full blocks only
    assert prefix_keys(SHARED[:8], BS, None) == keys[:2]
    assert prefix_keys(SHARED, BS, "tenant-a")[0] != keys[0]
    changed = [*SHARED[:4], 7, *SHARED[5:]]
    assert prefix_keys(changed, BS, None)[0] == keys[0] and prefix_keys(changed, BS, None)[1] != keys[1]
    assert len(prefix_keys(list(range(BS * (MAX_AFFINITY_BLOCKS + 3))), BS, None)) == MAX_AFFINITY_BLOCKS
    assert prefix_keys([1, 2, 3], BS, None) == []


def test_least_loaded_by_queue_then_free_blocks_then_index() -> None:
    r = router(3)
    r.note_stats(0, stats(running=3))
    r.note_stats(1, stats(running=1, waiting=1))
    r.note_stats(2, stats(running=3, free=10))
    assert r.route("a", [1]).core == 1  # queue 2 (running + waiting) against 3 and 3
    r.note_stats(1, stats(running=3))
    assert r.route("b", [2]).core == 0  # all three at 3: 0 and 1 have the most free blocks
    r.note_stats(0, stats(running=2, free=40))
    r.note_stats(1, stats(running=2, free=50))
    r.note_stats(2, stats(running=2, free=100))
    assert r.route("c", [3]).core == 2  # equal queues: the most free blocks wins
    for i in range(3):
        r.note_stats(i, stats(running=2))
    assert r.route("d", [4]).core == 0  # a full tie: the lowest index


def test_the_queue_counts_placed_sequences_until_they_end() -> None:
    r = router()
    assert [r.route(f"r{i}", [i], n=2).core for i in range(4)] == [0, 1, 0, 1]
    r.note_stats(0, stats())  # stale stats (a step that began before the adds) do not hide them
    assert r.route("x", [9]).core == 0 and r.cores[0].load == 5
    for i in (0, 2):
        r.sequence_done(f"r{i}", 0)
        r.sequence_done(f"r{i}", 1)
    r.sequence_done("r0", 1)  # a second report of the same end counts once
    assert r.cores[0].load == 1 and r.cores[1].load == 4
    r.note_stats(0, stats(running=6))  # a queue the router did not fill (another client) counts too
    assert r.cores[0].load == 6


def test_requests_sharing_a_prefix_follow_the_first_one() -> None:
    r = router()
    first = r.route("p0", [*SHARED, 1])
    r.note_stats(first.core, stats(running=1))  # the first core is busier, but affinity holds
    routes = [r.route(f"p{i}", [*SHARED, i, i]) for i in range(1, 6)]
    assert {x.core for x in routes} == {first.core}
    assert all(x.reason == "affinity" and x.matched_blocks == 6 for x in routes)
    assert r.route("other", [7] * 24).core != first.core  # an unrelated prompt is balanced
    assert r.cores[first.core].routed == {"affinity": 5, "balance": 1}


def test_a_short_common_opening_does_not_pull_traffic() -> None:
    r = router()
    opening = SHARED[:BS]  # one shared block, like a chat template's first tokens
    a = r.route("a", opening + [1] * 20)
    b = r.route("b", opening + [2] * 20)  # matches 1 of 6 keyed blocks: below the half needed
    assert b.reason == "balance" and b.core != a.core
    c = r.route("c", opening + [1] * 20 + [3])  # continues a's whole prompt
    assert (c.core, c.reason) == (a.core, "affinity")


def test_the_salt_separates_tenants() -> None:
    r = router()
    a = r.route("a", SHARED, cache_salt="t1")
    b = r.route("b", SHARED, cache_salt="t2")
    assert b.reason == "balance" and b.core != a.core
    assert r.route("c", SHARED, cache_salt="t1").core == a.core


def test_affinity_yields_to_an_overloaded_core_and_the_prefix_moves() -> None:
    r = router()
    home = r.route("p0", SHARED).core
    other = 1 - home
    r.note_stats(home, stats(running=AFFINITY_SLACK))
    assert r.route("p1", SHARED).reason == "affinity"  # AFFINITY_SLACK sequences ahead: kept
    r.note_stats(home, stats(running=AFFINITY_SLACK + 1))
    moved = r.route("p2", SHARED)
    assert (moved.core, moved.reason) == (other, "balance")
    assert r.route("p3", SHARED).core == other  # the prefix is now remembered on the other core
    # Relative slack: at a best queue of 40 the affinity core may be 20 ahead.
    r.note_stats(home, stats(running=40))
    r.note_stats(other, stats(running=60))
    assert r.route("p4", SHARED).core == other
    r.note_stats(other, stats(running=61))
    assert r.route("p5", SHARED).core == home


def test_affinity_yields_when_its_core_has_no_free_block() -> None:
    r = router()
    home = r.route("p0", SHARED).core
    r.note_stats(home, stats(free=0))
    assert r.route("p1", SHARED).core == 1 - home


def test_a_dead_core_leaves_routing_and_reports_its_requests() -> None:
    r = router()
    home = r.route("p0", SHARED).core
    r.route("q", [5] * 8)
    lost = r.mark_dead(home)
    assert lost == ["p0"] and r.core_of("p0") is None
    after = r.route("p1", SHARED)
    assert after.core == 1 - home and after.reason == "balance"  # the prefix died with its core
    assert all(r.route(f"n{i}", [i]).core == 1 - home for i in range(5))
    r.mark_dead(1 - home)
    with pytest.raises(EngineDeadError, match="every engine core is dead"):
        r.route("late", [1])


def test_exclude_skips_a_core_even_with_affinity() -> None:
    r = router()
    home = r.route("p0", SHARED).core
    assert r.route("p1", SHARED, exclude=[home]).core == 1 - home
    with pytest.raises(EngineDeadError):
        r.route("p2", SHARED, exclude=[0, 1])


def test_aborts_go_to_the_core_running_each_request() -> None:
    r = router()
    a, b = r.route("a", [1], n=2).core, r.route("b", [2]).core
    assert a != b
    parts = r.split_abort(CoreAbort(request_ids=["a", "b", "gone"]))
    assert parts == {a: CoreAbort(request_ids=["a"]), b: CoreAbort(request_ids=["b"])}
    assert r.num_placed == 0 and r.split_abort(CoreAbort(request_ids=["a"])) == {}


def test_stopped_sequences_and_finished_samples_are_tracked_per_index() -> None:
    r = router()
    core = r.route("a", [1], n=3).core
    parts = r.split_abort(CoreAbort(sequences=[("a", 1)], stopped=True))
    assert parts == {core: CoreAbort(sequences=[("a", 1)], stopped=True)}
    r.sequence_done("a", 0)
    assert r.core_of("a") == core  # sample 2 still runs: a later abort must still reach its core
    r.sequence_done("a", 2)
    assert r.core_of("a") is None and r.num_placed == 0


def test_forget_undoes_a_refused_placement() -> None:
    r = router()
    r.route("a", [1], n=4)
    r.forget("a")
    assert r.core_of("a") is None and all(c.load == 0 for c in r.cores)
    r.route("a", [1])  # the id may be placed again


def test_the_affinity_memory_is_bounded() -> None:
    r = Router(2, BS, affinity_entries=10)
    for i in range(20):
        r.route(f"r{i}", [i] * (3 * BS))
    assert len(r._prefixes) == 10
