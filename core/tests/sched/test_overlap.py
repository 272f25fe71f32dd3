"""Asynchronous scheduling in the scheduler: step N+1 planned before step N's tokens are applied."""

from paged_core.sched.output import SchedulerOutput
from paged_core.sched.request import RequestStatus
from paged_core.sched.scheduler import Scheduler

from .helpers import make_scheduler, req


def sampled_by(s: Scheduler, out: SchedulerOutput, token: int) -> dict[str, list[int]]:
    """``token`` for every row of ``out`` that reached the end of its known tokens (what the runner samples)."""
    done = {}
    for rid in out.num_scheduled_tokens:
        r = s.requests.get(rid)
        if r is not None and r.num_computed_tokens - r.num_output_placeholders >= r.num_tokens:
            done[rid] = [token]
    return done


def test_a_request_the_running_step_samples_for_gets_one_placeholder_token() -> None:
    s = make_scheduler()
    s.add_request(req("a", 5, max_tokens=8, ignore_eos=True))
    s.add_request(req("b", 70, start=100, max_tokens=8, ignore_eos=True))  # chunked: 59 of 70 tokens fit the budget
    first = s.schedule()
    assert first.num_scheduled_tokens == {"a": 5, "b": 59} and first.placeholder_req_ids == []
    nxt = s.schedule(overlap=True)  # the first step still runs: a's token is not known yet
    assert nxt.num_scheduled_tokens == {"a": 1, "b": 11}
    assert nxt.placeholder_req_ids == ["a"]  # b is still in its prompt: no token owed
    index = nxt.scheduled_cached_reqs.req_ids.index("a")
    assert nxt.scheduled_cached_reqs.new_token_ids[index] == []  # the core appends the token before it runs
    updates = s.update_from_output(first, {"a": [42]}, in_flight=nxt)
    assert [(u.req_id, u.new_token_ids) for u in updates] == [("a", [42])]
    a = s.requests["a"]
    assert a.all_token_ids[-1] == 42 and a.num_output_placeholders == 0 and a.num_computed_tokens == 6
    # The step in flight applied: b reaches its prompt's end and a samples again.
    updates = s.update_from_output(nxt, {"a": [43], "b": [7]})
    assert {u.req_id: u.new_token_ids for u in updates} == {"a": [43], "b": [7]}
    after = s.schedule()  # synchronous again: nothing owed, nothing announced twice
    assert after.placeholder_req_ids == [] and after.num_scheduled_tokens == {"a": 1, "b": 1}
    tokens = dict(zip(after.scheduled_cached_reqs.req_ids, after.scheduled_cached_reqs.new_token_ids, strict=True))
    assert tokens == {"a": [43], "b": [7]}


def test_a_request_that_stops_in_the_applied_step_drops_its_row_in_flight() -> None:
    s = make_scheduler()
    s.add_request(req("a", 4, max_tokens=1))
    s.add_request(req("b", 4, start=10, max_tokens=4, ignore_eos=True))
    first = s.schedule()
    nxt = s.schedule(overlap=True)
    assert sorted(nxt.placeholder_req_ids) == ["a", "b"]
    updates = s.update_from_output(first, sampled_by(s, first, 9), in_flight=nxt)
    assert {u.req_id: u.finish_reason for u in updates} == {"a": "length", "b": None}
    assert "a" not in s.requests
    # Its row in flight sampled a token nobody takes; b's is applied.
    updates = s.update_from_output(nxt, {"a": [1], "b": [2]})
    assert [(u.req_id, u.new_token_ids) for u in updates] == [("b", [2])]
    assert s.schedule().finished_req_ids == {"a"}  # the runner drops its row with the next plan


def test_a_request_preempted_by_the_plan_in_flight_still_gets_its_token() -> None:
    # Two requests of 4 tokens in 2 blocks of 4: the placeholder of the second needs a third block.
    s = make_scheduler(num_blocks=3, block_size=4)
    s.add_request(req("a", 4, max_tokens=4, ignore_eos=True))
    s.add_request(req("b", 4, start=10, max_tokens=4, ignore_eos=True))
    first = s.schedule()
    assert first.num_scheduled_tokens == {"a": 4, "b": 4}
    nxt = s.schedule(overlap=True)
    assert nxt.preempted_req_ids == ["b"] and nxt.num_scheduled_tokens == {"a": 1}
    b = s.requests["b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_output_placeholders == 1
    updates = s.update_from_output(first, {"a": [5], "b": [6]}, in_flight=nxt)
    assert {u.req_id: u.new_token_ids for u in updates} == {"a": [5], "b": [6]}
    assert b.all_token_ids == [10, 11, 12, 13, 6] and b.num_output_placeholders == 0
    assert b.status is RequestStatus.PREEMPTED  # it recomputes all five tokens when it runs again


def test_a_preempted_request_whose_owed_token_stops_it_leaves_the_queue() -> None:
    s = make_scheduler(num_blocks=3, block_size=4)
    s.add_request(req("a", 4, max_tokens=4, ignore_eos=True))
    s.add_request(req("b", 4, start=10, max_tokens=1))
    first = s.schedule()
    nxt = s.schedule(overlap=True)
    assert nxt.preempted_req_ids == ["b"]
    updates = s.update_from_output(first, {"a": [5], "b": [6]}, in_flight=nxt)
    assert {u.req_id: u.finish_reason for u in updates} == {"a": None, "b": "length"}
    assert "b" not in s.requests and s.num_waiting == 0
    assert s.schedule().finished_req_ids == {"b"}


def test_blocks_are_cached_only_once_the_step_computing_them_has_run() -> None:
    s = make_scheduler(block_size=4, max_num_batched_tokens=8)
    s.add_request(req("a", 16, max_tokens=2, ignore_eos=True))
    first = s.schedule()  # tokens 0..7
    nxt = s.schedule(overlap=True)  # tokens 8..15, not computed yet
    s.update_from_output(first, {}, in_flight=nxt)
    assert s.kv.num_cached_blocks["a"] == 2  # blocks 0 and 1 only
    s.update_from_output(nxt, {"a": [3]})
    assert s.kv.num_cached_blocks["a"] == 4


def test_without_overlap_the_plan_is_unchanged() -> None:
    # The synchronous loop never owes a token at planning time: no placeholder, whatever the flag.
    s = make_scheduler()
    s.add_request(req("a", 5, max_tokens=8, ignore_eos=True))
    out = s.schedule()
    s.update_from_output(out, {"a": [1]})
    plan = s.schedule(overlap=True)
    assert plan.placeholder_req_ids == [] and plan.num_scheduled_tokens == {"a": 1}
