"""Hypothesis state machine: the scheduler and KV-cache manager under random arrivals, steps,
aborts, forks, speculation, preemptions and prefix hits, checked after every rule.

A :class:`FakeRunner` keeps position-aware fake KV per KV-cache group, so a
wrong prefix hit, a missed copy-on-write or a stale block table is caught as
wrong content under a position some row attends to. Three kinds of model run:
full attention (one group), every layer sliding over a small window (blocks
behind it go back to the pool), and hybrids of both (several groups out of one
pool).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.errors import RequestRejectedError
from paged_core.memory.kv_groups import KVCacheGroups
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler

from .helpers import make_scheduler, req, step
from .sim import (
    COVERAGE,
    FakeRunner,
    FcfsWaitBound,
    HashRegistry,
    check_cached_hashes,
    check_pool,
    check_requests,
)

VOCAB = (0, 1, 2, 3, 4)  # tiny alphabet: equal blocks (and so prefix hits) come often
EOS = 0
PREFIXES = ((1, 2, 3, 4, 1, 2, 3, 4, 2, 2, 1, 3, 4, 4, 1, 2), (3, 1, 4, 1, 2, 3, 2, 4, 3, 3, 1, 1))
SALTS = (None, None, None, "tenant-a", "tenant-b")
LOOKAHEADS = (0, 0, 1, 3)  # extra slots reserved per step for speculative decoding
MAX_LIVE = 12  # keeps each example's cache pressure high but its state small


class SchedulerMachine(RuleBasedStateMachine):
    """Drives one :class:`Scheduler` with a :class:`FakeRunner`; subclasses pick the policy and the model's
    attention layers (their own ``setup`` draws the windows)."""

    policy = "fcfs"

    @initialize(
        block_size=st.sampled_from([1, 2, 4, 8]),
        num_blocks=st.integers(6, 28),
        budget=st.integers(1, 24),
        max_seqs=st.integers(1, 8),
        chunked=st.booleans(),
        max_model_len=st.integers(8, 96),
        lookahead=st.sampled_from(LOOKAHEADS),
    )
    def setup(
        self,
        block_size: int,
        num_blocks: int,
        budget: int,
        max_seqs: int,
        chunked: bool,
        max_model_len: int,
        lookahead: int,
    ) -> None:
        """Build a small cache and tight budgets so preemption and eviction really happen (full attention)."""
        self._build(block_size, num_blocks, budget, max_seqs, chunked, max_model_len, lookahead, (None,))

    def _build(
        self,
        block_size: int,
        num_blocks: int,
        budget: int,
        max_seqs: int,
        chunked: bool,
        max_model_len: int,
        lookahead: int,
        windows: tuple[int | None, ...],
    ) -> None:
        """The scheduler for a model whose layer ``i`` attends over ``windows[i]`` (``None``: full)."""
        sched = SchedulerConfig(
            max_model_len=max_model_len,
            max_num_batched_tokens=budget,
            max_num_seqs=max_seqs,
            enable_chunked_prefill=chunked,
            policy=self.policy,
            num_lookahead_tokens=lookahead,
        )
        groups = KVCacheGroups.from_windows(windows)
        self.s = Scheduler(sched, CacheConfig(num_blocks=num_blocks, block_size=block_size), kv_groups=groups)
        self.bs = block_size
        self.max_step = budget + lookahead  # the most tokens one step writes or reserves for a request
        self.runner = FakeRunner(block_size, [g.sliding_window for g in groups.groups])
        self.hashes = HashRegistry(self.s.kv.hash_fn, block_size, groups.num_groups, self.s.kv._key)
        self.waits = FcfsWaitBound()
        self.clock = 0
        self.finished: set[str] = set()  # finished or aborted, not yet announced to the runner
        self.rules_run = self.rules_checked = 0

    # ---- rules ------------------------------------------------------
    @precondition(lambda self: len(self.s.requests) < MAX_LIVE)
    @rule(
        prefix=st.sampled_from(PREFIXES),
        prefix_len=st.integers(0, 16),
        suffix=st.lists(st.sampled_from(VOCAB[1:]), max_size=12),
        whole_blocks=st.booleans(),
        max_tokens=st.integers(1, 24),
        salt=st.sampled_from(SALTS),
        stops_on_eos=st.booleans(),
        priority=st.integers(0, 3),
    )
    def add(
        self,
        prefix: tuple[int, ...],
        prefix_len: int,
        suffix: list[int],
        whole_blocks: bool,
        max_tokens: int,
        salt: str | None,
        stops_on_eos: bool,
        priority: int,
    ) -> None:
        """Submit a prompt built from a shared prefix (so prefix hits happen) and a random suffix."""
        self.rules_run += 1
        prompt = [*prefix[:prefix_len], *suffix] or [1]
        if whole_blocks and len(prompt) >= self.bs:
            prompt = prompt[: len(prompt) // self.bs * self.bs]
        self.clock += 1
        rid = f"r{self.clock}"
        req = Request(
            rid,
            prompt,
            max_tokens=max_tokens,
            eos_token_id=EOS,
            ignore_eos=not stops_on_eos,
            priority=priority,
            arrival_time=float(self.clock),
            cache_salt=salt,
        )
        cfg, usable = self.s.config, self.s.kv.pool.num_usable_blocks
        # Decoding, a full group holds every block and a sliding one at most its window's, widened by the
        # lookahead slots (which never pass the length cap, so a full group's count stays the prompt's).
        full = -(-len(prompt) // self.bs)
        windows = (g.window_blocks(self.bs, 1 + cfg.num_lookahead_tokens) for g in self.s.kv.groups.groups)
        too_big = (
            len(prompt) > cfg.max_model_len
            or sum(full if w is None else min(full, w) for w in windows) > usable
            or (not cfg.enable_chunked_prefill and len(prompt) > cfg.max_num_batched_tokens)
        )
        try:
            self.s.add_request(req)
        except RequestRejectedError:
            assert too_big, f"{req} rejected though it fits"
            COVERAGE["rejected"] += 1
            return
        assert not too_big, f"{req} accepted though it can never run"
        self.waits.arrive(req, len(prompt) + max_tokens)

    @rule(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 4))
    def step(self, seed: int, n: int) -> None:
        """``n`` engine steps (schedule, run the fake model, sample, update), checked after each."""
        self.rules_run += 1
        rng = random.Random(seed)
        for _ in range(n):
            self._step(rng)
            self._check()

    @precondition(lambda self: len(self.s.requests) >= 3)
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick: int) -> None:
        """Abort any live request, waiting or running."""
        self.rules_run += 1
        rid = sorted(self.s.requests)[pick % len(self.s.requests)]
        assert self.s.abort([rid, "no-such-id"]) == [rid]
        self._gone(rid)
        COVERAGE["aborts"] += 1

    @precondition(lambda self: bool(self.s.running) and len(self.s.requests) < MAX_LIVE)
    @rule(pick=st.integers(0, 10**6), replace=st.booleans(), token=st.sampled_from(VOCAB[1:]))
    def fork(self, pick: int, replace: bool, token: int) -> None:
        """Fork a running request (parallel sampling); the child shares its blocks copy-on-write."""
        self.rules_run += 1
        parent = self.s.running[pick % len(self.s.running)]
        assert parent.num_computed_tokens < parent.num_tokens  # between steps the last token is never computed
        self.clock += 1
        if len(self.s.running) >= self.s.config.max_num_seqs:
            with pytest.raises(RequestRejectedError, match="max_num_seqs"):
                self.s.fork(parent.request_id, f"f{self.clock}")
            return
        child = self.s.fork(parent.request_id, f"f{self.clock}", last_token_id=token if replace else None)
        assert child.all_token_ids[:-1] == parent.all_token_ids[:-1]
        assert self.s.kv.block_ids(child) == self.s.kv.block_ids(parent)
        work = child.num_tokens - child.num_computed_tokens + child.max_tokens - child.num_output_tokens
        self.waits.arrive(child, work)
        COVERAGE["forks"] += 1

    @precondition(lambda self: any(r.num_output_tokens and not r.spec_token_ids for r in self.s.running))
    @rule(pick=st.integers(0, 10**6), drafts=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=3))
    def speculate(self, pick: int, drafts: list[int]) -> None:
        """Give a decoding request draft tokens (speculative decoding)."""
        self.rules_run += 1
        decoding = [r for r in self.s.running if r.num_output_tokens and not r.spec_token_ids]
        req = decoding[pick % len(decoding)]
        req.spec_token_ids = list(drafts)
        self.waits.add_work(req, len(drafts))

    @rule()
    def reset_prefix_cache(self) -> None:
        """Resetting works only when idle, and then forgets every hash."""
        self.rules_run += 1
        busy = self.s.kv.pool.num_free_blocks < self.s.kv.pool.num_usable_blocks
        cached_before = dict(self.s.kv.pool.cached)
        assert self.s.reset_prefix_cache() is not busy
        assert self.s.kv.pool.cached == ({} if not busy else cached_before)

    # ---- invariants -------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        """Every check, after every rule."""
        if hasattr(self, "s"):
            self._check()
            self.rules_checked = self.rules_run

    def _check(self) -> None:
        self.hashes.extend(self.s.requests.values())
        check_pool(self.s)
        check_requests(self.s, self.runner, self.max_step)
        check_cached_hashes(self.s, self.runner, self.hashes)
        if self.policy == "fcfs":
            self.waits.check()

    def teardown(self) -> None:
        """Drain: no new arrivals; everything finishes and every block returns to the free queue."""
        if not hasattr(self, "s") or self.rules_checked != self.rules_run:
            return  # a rule or invariant already failed: let that failure stand
        rng = random.Random(0)
        bound = 2 * sum(self.waits.work.values()) + 2 * len(self.s.requests) + 4
        steps = 0
        while self.s.has_unfinished_requests():
            assert steps <= bound, f"drain did not finish in {bound} steps: {self.s.running} {list(self.s.waiting)}"
            self._step(rng)
            steps += 1
        out = self.s.schedule()
        assert out.is_empty and out.finished_req_ids == self.finished
        self.runner.execute(out)
        assert not self.runner.rows and not self.s.kv.req_to_blocks
        pool = self.s.kv.pool
        assert pool.num_free_blocks == pool.num_usable_blocks
        assert self.s.reset_prefix_cache() and not pool.cached
        assert all(b.block_hash is None for b in pool.blocks)
        COVERAGE["drain steps"] += steps

    # ---- helpers ----------------------------------------------------
    def _gone(self, rid: str) -> None:
        self.waits.gone(rid)
        self.finished.add(rid)

    def _step(self, rng: random.Random) -> None:
        s = self.s
        out = s.schedule()
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
        assert out.total_num_scheduled_tokens <= s.config.max_num_batched_tokens
        assert out.finished_req_ids == self.finished, "finished ids must be announced exactly once"
        self.finished = set()
        if s.has_unfinished_requests() and out.is_empty:
            # Only a request that cannot fit even alone preempts itself and leaves a step empty.
            assert out.preempted_req_ids, f"stalled: {s.running} {list(s.waiting)}"
        rank = Request.order_key if self.policy == "fcfs" else Request.priority_key
        for rid in out.preempted_req_ids:
            victim = s.requests[rid]
            assert victim.status is RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
            # The victim is always the lowest-ranked request: everyone still running outranks it.
            assert all(rank(r) < rank(victim) for r in s.running), f"{victim} preempted before {s.running}"
            self.waits.add_work(victim, victim.num_tokens)  # its KV is recomputed
        COVERAGE["preemptions"] += len(out.preempted_req_ids)
        COVERAGE["block copies"] += len(out.block_copies)
        COVERAGE["prefix-hit rows"] += sum(1 for n in out.scheduled_new_reqs if n.num_computed_tokens)
        COVERAGE["new rows with blocks behind a window"] += sum(
            1 for n in out.scheduled_new_reqs if any(0 in t for t in n.block_ids)
        )
        COVERAGE["spec rows"] += len(out.scheduled_spec_decode_tokens)
        COVERAGE["steps"] += 1
        before = self.runner.execute(out)
        sampled = self.runner.sample(out, before, rng, VOCAB)
        scheduled = [s.requests[rid] for rid in out.num_scheduled_tokens]
        updates = s.update_from_output(out, sampled)
        self.runner.absorb(updates)
        # Blocks cached during the update may hold tokens only just accepted by requests now gone.
        self.hashes.extend(scheduled)
        assert {u.req_id for u in updates} == set(sampled)
        for u in updates:
            if u.finish_reason is not None:
                self._gone(u.req_id)
        self.waits.tick()


class PriorityMachine(SchedulerMachine):
    """The same machine under the priority policy (no wait bound: low priority may starve by design)."""

    policy = "priority"


class SlidingMachine(SchedulerMachine):
    """Every layer slides over a small window: each request holds only its window's blocks, so long
    requests fit a cache far smaller than them, and prefix hits need only the window's blocks."""

    @initialize(
        windows=st.sampled_from([(2,), (3,), (5,), (3, 3), (2, 5)]),  # (2, 5): two sliding groups
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(3, 12),
        budget=st.integers(1, 16),
        max_seqs=st.integers(2, 8),
        chunked=st.booleans(),
        max_model_len=st.integers(8, 96),
        lookahead=st.sampled_from(LOOKAHEADS),
    )
    def setup(
        self,
        windows: tuple[int, ...],
        block_size: int,
        num_blocks: int,
        budget: int,
        max_seqs: int,
        chunked: bool,
        max_model_len: int,
        lookahead: int,
    ) -> None:
        """Groups of sliding layers only (the length cap is then max_model_len alone)."""
        self._build(block_size, num_blocks, budget, max_seqs, chunked, max_model_len, lookahead, windows)


HYBRIDS = (
    (None, 4, 4),  # 1 full : 2 sliding layers -> 3 groups of one layer
    (None, 3, 3, None),  # 2 : 2 -> a full group and a sliding group of two layers each
    (2, None),
    (5, None, 2),  # two windows and full attention
)


class HybridMachine(SchedulerMachine):
    """Full-attention and sliding layers: one block table per group out of one pool."""

    @initialize(
        windows=st.sampled_from(HYBRIDS),
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(8, 40),
        budget=st.integers(1, 16),
        max_seqs=st.integers(1, 6),
        chunked=st.booleans(),
        max_model_len=st.integers(8, 64),
        lookahead=st.sampled_from(LOOKAHEADS),
    )
    def setup(
        self,
        windows: tuple[int | None, ...],
        block_size: int,
        num_blocks: int,
        budget: int,
        max_seqs: int,
        chunked: bool,
        max_model_len: int,
        lookahead: int,
    ) -> None:
        """Groups from the layers' windows."""
        self._build(block_size, num_blocks, budget, max_seqs, chunked, max_model_len, lookahead, windows)


SETTINGS = settings(
    max_examples=400,
    stateful_step_count=80,
    deadline=None,  # whole-machine runs vary with the shared CI machine's load
    derandomize=True,  # CI must be stable: the same examples every run
    database=None,
)


@pytest.mark.parametrize("machine", [SchedulerMachine, PriorityMachine], ids=["fcfs", "priority"])
def test_scheduler_state_machine(machine: type[SchedulerMachine]) -> None:
    """Random workloads keep every invariant, and the run really exercised the hard paths."""
    COVERAGE.clear()
    run_state_machine_as_test(machine, settings=SETTINGS)
    for what in ("preemptions", "block copies", "prefix-hit rows", "spec rows", "forks", "aborts", "rejected"):
        assert COVERAGE[what] > 0, f"the machine never exercised {what}: {dict(COVERAGE)}"
    print(dict(COVERAGE))


# Fewer examples: CI's time is short, and these add only the window's bookkeeping to the machine above.
GROUP_SETTINGS = settings(SETTINGS, max_examples=60)
WINDOWED = ("preemptions", "block copies", "prefix-hit rows", "forks", "aborts", "blocks released behind a window")


@pytest.mark.parametrize("machine", [SlidingMachine, HybridMachine], ids=["sliding", "hybrid"])
def test_scheduler_state_machine_with_kv_cache_groups(machine: type[SchedulerMachine]) -> None:
    """Windowed and hybrid models keep every invariant: per-group tables, windows covered, no shared writes,
    reference counts per holder, hits whose blocks hold the request's tokens inside the window."""
    COVERAGE.clear()
    run_state_machine_as_test(machine, settings=GROUP_SETTINGS)
    for what in (*WINDOWED, "new rows with blocks behind a window"):
        assert COVERAGE[what] > 0, f"the machine never exercised {what}: {dict(COVERAGE)}"
    print(dict(COVERAGE))


# ---- liveness bugs the machine found, reduced to minimal cases ----------------
def test_lookahead_never_makes_a_request_that_fits_the_cache_unschedulable() -> None:
    """4 usable one-token blocks: a 3-token prompt fits, but 3 + 2 lookahead slots never do, so it waited forever."""
    s = make_scheduler(num_blocks=5, block_size=1, num_lookahead_tokens=2)
    s.add_request(req("a", 3, max_tokens=4))
    for _ in range(20):
        step(s)
    assert not s.has_unfinished_requests(), list(s.requests.values())


@pytest.mark.parametrize(
    ("windows", "num_blocks", "block_size", "lookahead", "prompt", "max_model_len"),
    [
        # 4 usable blocks of 1: the 3-token prompt fits its window of 3, but never with 2 lookahead slots: it
        # waited forever, never admitted.
        ((3,), 5, 1, 2, 3, 64),
        # 12 usable blocks of 2 over 3 groups: decoding position 5 with 3 lookahead slots needs 5 + 4 + 4 blocks;
        # the request preempted itself every step. Found by the hybrid state machine.
        ((None, 4, 4), 13, 2, 3, 1, 9),
    ],
    ids=["sliding", "hybrid"],
)
def test_lookahead_never_makes_a_windowed_request_that_fits_the_cache_unschedulable(
    windows: tuple[int | None, ...], num_blocks: int, block_size: int, lookahead: int, prompt: int, max_model_len: int
) -> None:
    """As above, with sliding windows: the length cap no longer bounds a request's blocks (its window does), so
    lookahead slots (never written) must not make a request that fits alone unschedulable."""
    s = make_scheduler(
        num_blocks=num_blocks,
        block_size=block_size,
        kv_groups=KVCacheGroups.from_windows(windows),
        num_lookahead_tokens=lookahead,
        max_model_len=max_model_len,
    )
    s.add_request(req("a", prompt, start=1, max_tokens=6, ignore_eos=True))
    for _ in range(40):
        step(s)
    assert not s.has_unfinished_requests(), (list(s.requests.values()), s.num_preemptions)


def test_preempted_request_longer_than_the_budget_resumes_without_chunked_prefill() -> None:
    """Without chunked prefill a victim must recompute all its tokens in one step; once it has outgrown the
    token budget, re-admission was refused forever."""
    s = make_scheduler(num_blocks=11, block_size=1, max_num_batched_tokens=4, enable_chunked_prefill=False)
    s.add_request(req("a", 2, max_tokens=8))
    s.add_request(req("b", 2, start=50, max_tokens=8))
    for _ in range(40):
        step(s)
    assert s.num_preemptions > 0
    assert not s.has_unfinished_requests(), list(s.requests.values())
