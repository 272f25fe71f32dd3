"""Scheduler: budgets, chunked prefill, prefix hits, preemption, stop rules, abort, forks."""

import pytest

from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.errors import RequestRejectedError
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler

from .helpers import make_scheduler, req, step


def test_running_first_then_waiting_and_new_then_cached_rows() -> None:
    s = make_scheduler()
    s.add_request(req("a", 6, max_tokens=3))
    out = step(s)
    assert [n.req_id for n in out.scheduled_new_reqs] == ["a"] and out.num_scheduled_tokens == {"a": 6}
    s.add_request(req("b", 5, start=100))
    out = step(s)
    assert list(out.num_scheduled_tokens) == ["a", "b"]
    assert out.num_scheduled_tokens == {"a": 1, "b": 5}
    assert out.scheduled_cached_reqs.req_ids == ["a"] and out.scheduled_cached_reqs.num_computed_tokens == [6]
    # a's 7th token still fits in the two blocks its prefill took: no block gained.
    assert out.scheduled_cached_reqs.new_block_ids == [[]]


def test_continuing_rows_list_only_gained_blocks() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("a", 4, max_tokens=10))
    out = step(s)
    (first_blocks,) = out.scheduled_new_reqs[0].block_ids  # one KV-cache group
    assert len(first_blocks) == 1
    out = step(s)  # token 5 needs a second block
    assert out.scheduled_cached_reqs.new_block_ids == [[[s.kv.block_ids(s.requests["a"])[0][1]]]]
    out = step(s)  # token 6 fits
    assert out.scheduled_cached_reqs.new_block_ids == [[]]


def test_chunked_prefill_respects_budget_exactly() -> None:
    s = make_scheduler(max_num_batched_tokens=10)
    s.add_request(req("long", 25, max_tokens=2))
    s.add_request(req("short", 3, start=500, max_tokens=2))
    sizes = []
    for _ in range(3):
        out = step(s)
        assert out.total_num_scheduled_tokens <= 10
        sizes.append(dict(out.num_scheduled_tokens))
    assert sizes[0] == {"long": 10}
    assert sizes[1] == {"long": 10}
    assert sizes[2] == {"long": 5, "short": 3}
    assert s.requests["long"].num_output_tokens == 1  # sampled only when the prompt was done


def test_without_chunking_a_prompt_waits_for_a_whole_step() -> None:
    s = make_scheduler(max_num_batched_tokens=10, enable_chunked_prefill=False)
    s.add_request(req("a", 8, max_tokens=5))
    s.add_request(req("b", 6, start=100, max_tokens=5))
    out = step(s)
    assert out.num_scheduled_tokens == {"a": 8}  # b (6) does not fit in the 2 left
    out = step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 6}


def test_max_num_seqs_caps_running() -> None:
    s = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(f"r{i}", 3, start=10 * i))
    out = step(s)
    assert sorted(out.num_scheduled_tokens) == ["r0", "r1"] and s.num_waiting == 1


def test_fully_cached_prompt_still_schedules_its_last_token() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("a", 8, max_tokens=1))
    step(s)
    assert "a" not in s.requests  # finished after one token
    s.add_request(req("b", 8, max_tokens=1))
    out = step(s)
    (new,) = out.scheduled_new_reqs
    assert new.num_computed_tokens == 4  # one block hit; the block with the last token is recomputed
    assert out.num_scheduled_tokens == {"b": 4}
    assert s.kv.stats.hits == 4


def test_stop_rules() -> None:
    s = make_scheduler()
    s.add_request(req("eos", 3, eos_token_id=5, max_tokens=10))
    s.add_request(req("ign", 3, start=50, eos_token_id=5, ignore_eos=True, max_tokens=2))
    s.add_request(req("stop", 3, start=90, stop_token_ids=[5], max_tokens=10))
    s.add_request(req("min", 3, start=130, eos_token_id=5, min_tokens=2, max_tokens=10))
    step(s, token=5)
    assert set(s.requests) == {"ign", "min"}
    reqs = {"min": s.requests["min"], "ign": s.requests["ign"]}
    step(s, token=5)
    assert not s.requests  # ign hit max_tokens=2; min stops at EOS once it has 2 tokens
    assert reqs["min"].output_token_ids == [5, 5] and reqs["min"].status is RequestStatus.FINISHED_STOPPED
    assert reqs["ign"].status is RequestStatus.FINISHED_LENGTH
    assert s.schedule().finished_req_ids == {"ign", "min"}


def test_max_model_len_stops_generation() -> None:
    s = make_scheduler(max_model_len=6)
    s.add_request(req("a", 4, max_tokens=100, ignore_eos=True))
    finishes = []
    while s.has_unfinished_requests():
        out = s.schedule()
        finishes += [u for u in s.update_from_output(out, {"a": [9]}) if u.finish_reason]
    assert finishes[0].finish_reason == "length"
    assert s.kv.num_free_blocks == s.kv.pool.num_usable_blocks


def test_prompt_too_long_is_rejected_and_does_not_block_the_queue() -> None:
    s = make_scheduler(max_model_len=16)
    with pytest.raises(RequestRejectedError, match="max_model_len=16"):
        s.add_request(req("huge", 17))
    s.add_request(req("ok", 4))
    assert step(s).num_scheduled_tokens == {"ok": 4}


def test_prompt_larger_than_whole_cache_is_rejected() -> None:
    s = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks = 12 tokens
    with pytest.raises(RequestRejectedError, match="holds 3 blocks"):
        s.add_request(req("big", 13))


def test_prompt_over_budget_without_chunking_is_rejected() -> None:
    s = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    with pytest.raises(RequestRejectedError, match="max_num_batched_tokens=8"):
        s.add_request(req("a", 9))


def test_duplicate_id_rejected() -> None:
    s = make_scheduler()
    s.add_request(req("a", 3))
    with pytest.raises(RequestRejectedError, match="already in use"):
        s.add_request(req("a", 3))


def test_fcfs_preempts_newest_puts_it_first_and_it_resumes_with_own_blocks() -> None:
    # 7 usable blocks of 4: two 11-token prompts take 3 blocks each; then both need a 4th.
    s = make_scheduler(num_blocks=8, block_size=4)
    s.add_request(req("old", 11, max_tokens=3, ignore_eos=True))
    s.add_request(req("new", 11, start=100, max_tokens=8, ignore_eos=True))
    step(s)
    out = step(s)  # both now hold 12 tokens; 3 blocks each
    out = step(s)  # each needs a 4th block: only the oldest can have it
    assert out.preempted_req_ids == ["new"]
    assert s.requests["new"].status is RequestStatus.PREEMPTED and s.waiting.peek().request_id == "new"
    # Finish "old"; then "new" resumes and hits its own freed blocks.
    while "old" in s.requests:
        out = step(s)
    while not any(n.req_id == "new" for n in out.scheduled_new_reqs):
        out = step(s)
    (resumed,) = [n for n in out.scheduled_new_reqs if n.req_id == "new"]
    assert resumed.num_computed_tokens == 12  # 13 known tokens; 3 full blocks hit, the last is recomputed
    assert s.kv.stats.preempted_hits == 12 and s.kv.stats.preempted_requests == 1
    assert s.kv.stats.hits == 0  # resumed hits are not counted as prefix sharing


def test_priority_victim_is_lowest_priority_then_latest_arrival() -> None:
    s = make_scheduler(num_blocks=10, block_size=4, policy="priority")  # 9 usable
    # Priority value: higher = less important. Arrivals in this order.
    s.add_request(req("p0", 11, max_tokens=8, priority=0, arrival_time=1.0))
    s.add_request(req("p1_early", 11, start=100, max_tokens=8, priority=1, arrival_time=2.0))
    s.add_request(req("p1_late", 11, start=200, max_tokens=8, priority=1, arrival_time=3.0))
    step(s)
    step(s)
    out = step(s)  # everyone needs a 4th block; 0 free
    assert out.preempted_req_ids[0] == "p1_late"
    assert "p0" in out.num_scheduled_tokens


def test_priority_victim_may_be_an_already_scheduled_request() -> None:
    s = make_scheduler(num_blocks=7, block_size=4, policy="priority")
    s.add_request(req("low", 11, max_tokens=8, priority=5, arrival_time=1.0))
    s.add_request(req("high", 11, start=100, max_tokens=8, priority=0, arrival_time=2.0))
    step(s)
    step(s)
    out = step(s)
    assert out.preempted_req_ids == ["low"]
    assert out.num_scheduled_tokens == {"high": 1}
    assert out.total_num_scheduled_tokens == 1


def test_abort_frees_blocks_and_is_reported() -> None:
    s = make_scheduler()
    s.add_request(req("a", 9, max_tokens=50))
    s.add_request(req("w", 9, start=300, max_tokens=50))
    step(s)
    assert s.abort(["a", "w", "nope"]) == ["a", "w"]
    assert s.kv.num_free_blocks == s.kv.pool.num_usable_blocks
    out = s.schedule()
    assert out.finished_req_ids == {"a", "w"} and out.is_empty


def test_fork_shares_prompt_blocks_and_copies_on_first_write() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("p", 6, max_tokens=4, ignore_eos=True))
    step(s, token=7)  # prefill; samples 7 -> 7 tokens known, 6 computed
    child = s.fork("p", "p#1", last_token_id=8)
    assert child.all_token_ids[-1] == 8 and s.requests["p"].all_token_ids[-1] == 7
    out = s.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["p#1"]
    # Both write position 6 into the shared second block: the first writer copies it.
    assert len(out.block_copies) == 1
    src, dst = out.block_copies[0]
    tables = {"p": s.kv.block_ids(s.requests["p"])[0], "p#1": s.kv.block_ids(child)[0]}
    assert tables["p"][0] == tables["p#1"][0]
    assert tables["p"][1] != tables["p#1"][1] and src in (tables["p"][1], tables["p#1"][1])
    assert dst in (tables["p"][1], tables["p#1"][1])
    s.update_from_output(out, {"p": [1], "p#1": [2]})
    assert s.requests["p"].output_token_ids == [7, 1] and child.output_token_ids == [8, 2]


def test_speculative_tokens_are_scheduled_and_rejected_ones_rolled_back() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("a", 5, max_tokens=20, ignore_eos=True))
    step(s, token=9)  # 6 known, 5 computed
    r = s.requests["a"]
    r.spec_token_ids = [11, 12, 13]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_decode_tokens == {"a": [11, 12, 13]}
    assert r.num_computed_tokens == 9
    s.update_from_output(out, {"a": [11, 40]})  # one draft accepted, plus a bonus token
    assert r.output_token_ids == [9, 11, 40]
    assert r.num_computed_tokens == 7 and r.num_tokens == 8


def test_finished_requests_free_everything() -> None:
    s = make_scheduler()
    for i in range(5):
        s.add_request(req(f"r{i}", 3 + i, start=20 * i, max_tokens=3 + i, ignore_eos=True))
    while s.has_unfinished_requests():
        step(s)
    assert s.kv.num_free_blocks == s.kv.pool.num_usable_blocks
    assert s.reset_prefix_cache() is True


def test_reset_prefix_cache_refused_while_running() -> None:
    s = make_scheduler()
    s.add_request(req("a", 9, max_tokens=5))
    step(s)
    assert s.reset_prefix_cache() is False


def test_fork_never_exceeds_max_num_seqs() -> None:
    s = make_scheduler(max_num_seqs=2)
    s.add_request(req("p", 5, max_tokens=4, ignore_eos=True))
    step(s)
    s.fork("p", "p#1")
    with pytest.raises(RequestRejectedError, match="max_num_seqs=2"):
        s.fork("p", "p#2")
    assert s.num_running == 2 and "p#2" not in s.requests


def test_a_prefix_being_computed_is_not_computed_twice_in_one_step() -> None:
    s = make_scheduler(max_num_batched_tokens=64)
    shared = list(range(100, 116))  # four blocks of 4
    s.add_request(Request("a", [*shared, 1, 2]))
    s.add_request(Request("b", [*shared, 3, 4]))
    s.add_request(Request("c", list(range(500, 506))))  # behind b: FCFS order is kept
    first = step(s)
    assert set(first.num_scheduled_tokens) == {"a"}, "b would recompute a's blocks in the same step"
    second = step(s)
    # b now starts from a's four cached blocks and computes only its own tail.
    assert second.num_scheduled_tokens["b"] == 2 and s.requests["b"].num_cached_tokens == 16
    assert second.num_scheduled_tokens["c"] == 6


def test_requests_without_a_shared_prefix_are_admitted_together() -> None:
    s = make_scheduler(max_num_batched_tokens=64)
    s.add_request(Request("a", list(range(100, 118))))
    s.add_request(Request("b", list(range(200, 218))))
    assert set(step(s).num_scheduled_tokens) == {"a", "b"}


def test_without_prefix_caching_shared_prompts_are_admitted_together() -> None:
    s = Scheduler(
        SchedulerConfig(max_model_len=1024, max_num_batched_tokens=64),
        CacheConfig(num_blocks=64, block_size=4, enable_prefix_caching=False),
    )
    shared = list(range(100, 116))
    s.add_request(Request("a", [*shared, 1, 2]))
    s.add_request(Request("b", [*shared, 3, 4]))
    assert set(step(s).num_scheduled_tokens) == {"a", "b"}
