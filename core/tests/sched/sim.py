"""A fake model runner and independent bookkeeping for the scheduler state-machine test.

It keeps what a real runner keeps (one row per request: known tokens and a
block table, rebuilt only from :class:`SchedulerOutput`) and a fake KV store
``content[slot] = (token_id, position)``. A slot holds the right KV only when
both match, so a prefix hit on the wrong block, a missed copy-on-write or a
stale block table shows up as wrong content under a position some row
attends to.

:class:`HashRegistry` re-derives every block hash, :class:`FcfsWaitBound`
bounds waits under fcfs, and the ``check_*`` functions are the invariants
checked between steps.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from paged_core.memory.hashing import ROOT_HASH, BlockHashFn
from paged_core.sched.output import RequestUpdate, SchedulerOutput
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler

KV = tuple[int, int]
"""What a slot holds: (token id, position)."""


@dataclass
class Row:
    """The runner's view of one request: its known tokens and its block table."""

    tokens: list[int]
    table: list[int] = field(default_factory=list)


class FakeRunner:
    """Plays the model runner: applies an output, writes fake KV, checks what attention would read."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.content: dict[int, KV] = {}
        self.rows: dict[str, Row] = {}

    def slot(self, row: Row, pos: int) -> int:
        """The slot of position ``pos`` in ``row`` (its table must cover it)."""
        return row.table[pos // self.bs] * self.bs + pos % self.bs

    def block_content(self, block_id: int) -> list[KV | None]:
        """The fake KV of every slot of one block."""
        return [self.content.get(block_id * self.bs + j) for j in range(self.bs)]

    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns each scheduled row's computed-token count before the step.

        Order matters and mirrors a real runner: drop rows, copy blocks, update
        tables, write KV for every row, then check every row's attended positions.
        """
        for rid in (*out.finished_req_ids, *out.preempted_req_ids):
            self.rows.pop(rid, None)
        self._copy_blocks(out.block_copies)
        before = self._update_tables(out)
        seqs = {rid: self.rows[rid].tokens + out.scheduled_spec_decode_tokens.get(rid, []) for rid in before}
        writer: dict[int, str] = {}
        for rid, n in out.num_scheduled_tokens.items():
            row, start = self.rows[rid], before[rid]
            seq = seqs[rid]
            assert start + n <= len(seq), f"{rid}: scheduled {n} tokens after {start}, but only {len(seq)} are known"
            assert len(row.table) * self.bs >= start + n, f"{rid}: table {row.table} cannot hold {start + n} tokens"
            for pos in range(start, start + n):
                block = row.table[pos // self.bs]
                # Copy-on-write: no two rows may write into one block in a step.
                assert writer.setdefault(block, rid) == rid, f"block {block} written by {writer[block]} and {rid}"
                self.content[self.slot(row, pos)] = (seq[pos], pos)
        self._check_no_shared_writes(writer)
        for rid, n in out.num_scheduled_tokens.items():
            row, seq = self.rows[rid], seqs[rid]
            for pos in range(before[rid] + n):
                got = self.content.get(self.slot(row, pos))
                assert got == (seq[pos], pos), (
                    f"{rid} attends to position {pos} (token {seq[pos]}) in block {row.table[pos // self.bs]}, "
                    f"which holds {got}; table {row.table}"
                )
        return before

    def sample(
        self, out: SchedulerOutput, before: dict[str, int], rng: random.Random, vocab: Sequence[int]
    ) -> dict[str, list[int]]:
        """Tokens for rows that reached the end of their known tokens: accepted drafts plus one."""
        sampled: dict[str, list[int]] = {}
        for rid, n in out.num_scheduled_tokens.items():
            if before[rid] + n < len(self.rows[rid].tokens):
                continue  # still mid-prefill: no logits
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            accepted = rng.randint(0, len(drafts))
            sampled[rid] = [*drafts[:accepted], rng.choice(vocab)]
        return sampled

    def absorb(self, updates: Sequence[RequestUpdate]) -> None:
        """Append the tokens the scheduler accepted to each row."""
        for u in updates:
            self.rows[u.req_id].tokens.extend(u.new_token_ids)

    def _copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        # The contract lets a backend run the pairs in parallel: they must be independent.
        dsts = [d for _, d in copies]
        assert len(set(dsts)) == len(dsts), f"a block is a copy destination twice: {copies}"
        assert not set(dsts) & {s for s, _ in copies}, f"a copy destination is also a source: {copies}"
        # Read every source before writing any destination, as a parallel kernel would.
        snapshot = [[self.content.get(src * self.bs + j) for j in range(self.bs)] for src, _ in copies]
        for (src, dst), values in zip(copies, snapshot, strict=True):
            assert src != 0 and dst != 0, f"copy {src}->{dst} touches the null block"
            for j, kv in enumerate(values):
                if kv is None:
                    self.content.pop(dst * self.bs + j, None)
                else:
                    self.content[dst * self.bs + j] = kv

    def _update_tables(self, out: SchedulerOutput) -> dict[str, int]:
        before: dict[str, int] = {}
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.rows, f"{new.req_id} announced as new while the runner still has it"
            self.rows[new.req_id] = Row(list(new.token_ids), list(new.block_ids))
            before[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        assert set(out.replaced_block_ids) <= set(cached.req_ids), "replacements for rows that are not continuing"
        for rid, gained, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True):
            assert rid in self.rows, f"{rid} continues but the runner never saw it as new"
            row = self.rows[rid]
            for index, block_id in out.replaced_block_ids.get(rid, ()):
                row.table[index] = block_id
            row.table.extend(gained)
            before[rid] = computed
        assert set(before) == set(out.num_scheduled_tokens), "rows and num_scheduled_tokens disagree"
        for rid in before:
            assert 0 not in self.rows[rid].table, f"{rid}: the null block is in its table"
        return before

    def _check_no_shared_writes(self, writer: dict[int, str]) -> None:
        # A block written this step must belong to the writer alone among the rows the runner holds.
        for rid, row in self.rows.items():
            for block in row.table:
                owner = writer.get(block)
                assert owner is None or owner == rid, f"{owner} wrote block {block}, which {rid} also holds"


class HashRegistry:
    """Our own hash chain of every request seen, and what each hash means: (block index, block tokens).

    Computed independently of the manager (salt on block 0, chained from
    ``ROOT_HASH``), so a hash the manager indexes but we never derived means
    its chain or its extra keys are wrong.
    """

    def __init__(self, hash_fn: BlockHashFn, block_size: int) -> None:
        self.hash_fn, self.bs = hash_fn, block_size
        self.chains: dict[str, list[bytes]] = {}
        self.meaning: dict[bytes, tuple[int, tuple[int, ...]]] = {}

    def extend(self, reqs: Iterable[Request]) -> None:
        """Hash every full block of each request's known tokens (tokens only ever get appended)."""
        bs = self.bs
        for req in reqs:
            chain = self.chains.setdefault(req.request_id, [])
            toks = req.all_token_ids
            for i in range(len(chain), len(toks) // bs):
                extra = (("salt", req.cache_salt),) if i == 0 and req.cache_salt is not None else ()
                block = tuple(toks[i * bs : (i + 1) * bs])
                chain.append(self.hash_fn(chain[-1] if chain else ROOT_HASH, block, extra))
                assert self.meaning.setdefault(chain[-1], (i, block)) == (i, block), "hash collision"


class FcfsWaitBound:
    """Under fcfs a request waits at most as many steps as there are tokens to compute for it and for
    the live requests that outrank it (each non-empty step computes at least one of those).

    Work counts prompts plus ``max_tokens``, drafts, and recompute after preemption.
    """

    def __init__(self) -> None:
        self.reqs: dict[str, Request] = {}
        self.ages: dict[str, int] = {}
        self.work: dict[str, int] = {}

    def arrive(self, req: Request, work: int) -> None:
        """Start the clock for ``req``; its own ``work`` also delays everyone it outranks."""
        ahead = sum(w for rid, w in self.work.items() if self.reqs[rid].order_key() < req.order_key())
        self.add_work(req, work, include_self=False)
        self.reqs[req.request_id], self.ages[req.request_id] = req, 0
        self.work[req.request_id] = work + ahead

    def add_work(self, req: Request, tokens: int, include_self: bool = True) -> None:
        """``tokens`` more to compute for ``req``: they delay it and every live request it outranks."""
        for rid, other in self.reqs.items():
            if other.order_key() > req.order_key() or (include_self and other is req):
                self.work[rid] += tokens

    def gone(self, rid: str) -> None:
        """``rid`` finished or was aborted."""
        self.reqs.pop(rid, None)
        self.ages.pop(rid, None)
        self.work.pop(rid, None)

    def tick(self) -> None:
        """One step passed."""
        for rid in self.ages:
            self.ages[rid] += 1

    def check(self) -> None:
        """No live request has waited longer than its bound (slack: a self-preempted empty step)."""
        for rid, age in self.ages.items():
            assert age <= self.work[rid] + 2, f"fcfs: {rid} waited {age} steps, bound {self.work[rid] + 2}"


# ---- invariants over the scheduler's state (between steps) ----------------
def check_pool(s: Scheduler) -> None:
    """Free and referenced blocks partition the usable blocks; reference counts match the tables."""
    pool = s.kv.pool
    free = [b.block_id for b in pool.free_queue]
    assert len(free) == len(set(free)) == pool.num_free_blocks, f"free queue corrupt: {free}"
    assert 0 not in free and pool.null_block.ref_cnt == 0, "the null block was handed out"
    assert all(pool.blocks[i].ref_cnt == 0 for i in free), "a block in the free queue is referenced"
    used = [b.block_id for b in pool.blocks[1:] if b.ref_cnt > 0]
    assert len(free) + len(used) == pool.num_usable_blocks, f"{len(free)} free + {len(used)} used blocks"
    holders: Counter[int] = Counter()
    for rid, blocks in s.kv.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        assert len(ids) == len(set(ids)), f"{rid} holds a block twice: {ids}"
        holders.update(ids)
    for b in pool.blocks[1:]:
        assert b.ref_cnt == holders[b.block_id], f"{b!r} is held by {holders[b.block_id]} requests"
    assert set(s.kv.req_to_blocks) == {r.request_id for r in s.running}, "only running requests hold blocks"


def check_requests(s: Scheduler, runner: FakeRunner) -> None:
    """Statuses, progress counters and block coverage; the runner's rows agree with the scheduler."""
    running = {r.request_id for r in s.running}
    waiting = {r.request_id for r in s.waiting}
    assert len(running) == len(s.running) and not running & waiting, "a request is queued twice"
    assert running | waiting == set(s.requests), "live requests are neither running nor waiting"
    for r in s.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and r.num_computed_tokens == 0, r
    for r in s.running:
        assert r.status is RequestStatus.RUNNING and 0 <= r.num_computed_tokens < r.num_tokens, r
        blocks = s.kv.req_to_blocks[r.request_id]
        assert len(blocks) * s.block_size >= r.num_computed_tokens, f"{r}: {len(blocks)} blocks"
        row = runner.rows.get(r.request_id)
        if row is not None:  # a fork child is unknown to the runner until first scheduled
            assert row.tokens == r.all_token_ids, f"{r}: runner has tokens {row.tokens}"
            assert row.table == s.kv.block_ids(r), f"{r}: runner table {row.table} != {s.kv.block_ids(r)}"


def check_cached_hashes(s: Scheduler, runner: FakeRunner, registry: HashRegistry) -> None:
    """Every cached hash names a block holding exactly the tokens (and positions) it was computed from."""
    pool, bs = s.kv.pool, s.block_size
    for h, b in pool.cached.items():
        assert b.block_hash == h and not b.is_null, f"index entry {h.hex()[:8]} -> {b!r}"
        assert h in registry.meaning, f"{b!r}: its hash matches no block of any request seen (salt or chain wrong?)"
        index, tokens = registry.meaning[h]
        want = [(t, index * bs + j) for j, t in enumerate(tokens)]
        assert runner.block_content(b.block_id) == want, f"{b!r} holds {runner.block_content(b.block_id)}, want {want}"
    for b in pool.blocks:
        if b.block_hash is not None:
            assert pool.cached.get(b.block_hash) is b, f"{b!r} keeps a hash the index does not map to it"
    for r in s.running:
        chain = registry.chains[r.request_id]
        assert r.block_hashes == chain[: len(r.block_hashes)], f"{r}: its block hashes differ from ours"
        for i, b in enumerate(s.kv.req_to_blocks[r.request_id][: r.num_computed_tokens // bs]):
            assert b.block_hash in (None, chain[i]), f"{r}: block {i} ({b!r}) is cached under another prefix"
