"""The scheduler's methods for what the engine core changes in its requests: drafts, beams' tokens, sampled forks."""

import pytest

from paged_core.sched.request import RequestStatus

from .helpers import make_scheduler, req, step


def test_drafts_go_only_to_a_request_about_to_decode() -> None:
    s = make_scheduler(max_num_batched_tokens=4)
    s.add_request(req("a", 6, max_tokens=20, ignore_eos=True))
    s.add_request(req("w", 3, start=50))  # no budget left this step: still waiting
    s.schedule()  # a's first chunk of 4: two prompt tokens still to compute
    assert s.about_to_decode() == []
    with pytest.raises(ValueError, match="not about to decode"):
        s.set_drafts("a", [1, 2])
    with pytest.raises(ValueError, match="not about to decode"):
        s.set_drafts("w", [1])
    with pytest.raises(ValueError, match="not about to decode"):
        s.set_drafts("nope", [1])


def test_drafts_set_through_the_scheduler_are_scheduled_after_the_last_token() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("a", 5, max_tokens=20, ignore_eos=True))
    step(s, token=9)
    assert [r.request_id for r in s.about_to_decode()] == ["a"]
    drafts = [11, 12]
    s.set_drafts("a", drafts)
    drafts.append(13)  # the scheduler keeps its own copy
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 3} and out.scheduled_spec_decode_tokens == {"a": [11, 12]}
    (update,) = s.update_from_output(out, {"a": [11, 12, 40]})
    assert update.new_token_ids == [11, 12, 40] and s.requests["a"].output_token_ids == [9, 11, 12, 40]


def test_append_token_extends_without_stop_rules() -> None:
    s = make_scheduler()
    s.add_request(req("b", 4, max_tokens=1, eos_token_id=7))
    out = s.schedule()
    assert s.update_from_output(out, {}) == []  # the row ran; its next token is the caller's to choose
    s.append_token("b", 7)  # an EOS past max_tokens: a beam's search decides, the scheduler does not stop it
    assert s.is_running("b") and s.requests["b"].output_token_ids == [7]
    assert s.about_to_decode() == [s.requests["b"]]
    with pytest.raises(ValueError, match="no such request"):
        s.append_token("nope", 1)


def test_fork_sampled_applies_the_stop_rules_to_the_childs_token() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("p", 6, max_tokens=4, stop_token_ids=[99]))
    step(s, token=5)
    going = s.fork_sampled("p", "p#1", 6)
    assert (going.req_id, going.new_token_ids, going.finish_reason) == ("p#1", [6], None)
    assert s.is_running("p#1") and s.requests["p#1"].all_token_ids[-1] == 6
    stopped = s.fork_sampled("p", "p#2", 99)
    assert stopped.finish_reason == "stop" and "p#2" not in s.requests and not s.is_running("p#2")
    assert "p#2" in s.schedule().finished_req_ids


def test_reads_by_id() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("a", 9, max_tokens=3))
    assert not s.is_running("a") and s.num_cached_tokens("a") == 0 and s.block_ids("a") == []
    step(s)
    assert s.is_running("a") and [len(t) for t in s.block_ids("a")] == [3]
    s.add_request(req("b", 9, max_tokens=3))  # the same prompt: two full blocks come from the cache
    out = step(s)
    assert s.num_cached_tokens("b") == 8
    assert s.num_cached_tokens("nope") is None and s.block_ids("nope") == [] and not s.is_running("nope")
    assert out.num_scheduled_tokens["b"] == 1


def test_each_update_carries_the_prefix_hit() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(req("a", 9, max_tokens=3))
    step(s)
    s.add_request(req("b", 9, max_tokens=1))
    out = s.schedule()
    updates = {u.req_id: u for u in s.update_from_output(out, {"a": [1], "b": [2]})}
    assert updates["a"].num_cached_tokens == 0 and updates["b"].num_cached_tokens == 8
    assert updates["b"].finish_reason == RequestStatus.FINISHED_LENGTH.value
