"""Request validation and the waiting queues."""

import pytest

from paged_core.errors import RequestRejectedError
from paged_core.sched.queue import FcfsQueue, PriorityQueue
from paged_core.sched.request import Request


def test_bad_requests_are_refused_with_a_reason() -> None:
    with pytest.raises(RequestRejectedError, match="empty"):
        Request("a", [])
    with pytest.raises(RequestRejectedError, match="max_tokens"):
        Request("a", [1], max_tokens=0)
    with pytest.raises(RequestRejectedError, match="min_tokens"):
        Request("a", [1], max_tokens=2, min_tokens=3)


def test_token_views() -> None:
    r = Request("a", [1, 2, 3])
    r.all_token_ids += [7, 8]
    r.spec_token_ids = [9]
    assert r.prompt_token_ids == [1, 2, 3] and r.output_token_ids == [7, 8]
    assert r.num_tokens == 5 and r.num_tokens_with_spec == 6 and r.num_output_tokens == 2


def test_fcfs_queue_prepend_goes_first() -> None:
    """A preempted request that arrived before everything waiting goes back to the very front."""
    q = FcfsQueue()
    c, a, b = Request("c", [1]), Request("a", [1]), Request("b", [1])
    q.add(a)
    q.add(b)
    q.prepend(c)
    assert [r.request_id for r in q] == ["c", "a", "b"]
    q.remove(a)
    assert q.pop() is c and q.peek() is b and len(q) == 1


def test_fcfs_queue_prepend_keeps_rank_for_a_forked_child() -> None:
    """A fork's child ranks with its parent's arrival: preempted after an earlier-ranked request, it goes back
    behind that one, not in front of it (in front, it overtook and starved it: fcfs wait-bound failure)."""
    q = FcfsQueue()
    parent = Request("parent", [1], arrival_time=1.0)
    first_child, later = parent.clone("f2"), Request("r3", [1], arrival_time=3.0)
    second_child = parent.clone("f7")
    q.add(later)
    q.prepend(first_child)
    q.prepend(second_child)
    assert [r.request_id for r in q] == ["f2", "f7", "r3"]


def test_priority_queue_orders_by_priority_then_arrival() -> None:
    q = PriorityQueue()
    late_hi = Request("late_hi", [1], priority=0, arrival_time=5.0)
    early_lo = Request("early_lo", [1], priority=2, arrival_time=1.0)
    early_hi = Request("early_hi", [1], priority=0, arrival_time=2.0)
    for r in (late_hi, early_lo, early_hi):
        q.add(r)
    assert [r.request_id for r in q] == ["early_hi", "late_hi", "early_lo"]
    q.remove(late_hi)
    assert q.pop() is early_hi and q.pop() is early_lo and len(q) == 0
