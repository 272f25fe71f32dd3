"""A fake model runner and independent bookkeeping for the scheduler state-machine test.

It keeps what a real runner keeps (one row per request: known tokens and one
block table per KV-cache group, rebuilt only from :class:`SchedulerOutput`) and
a fake KV store ``content[slot] = (group, token_id, position)``. A slot holds
the right KV only when all three match, so a prefix hit on the wrong block (or
on another group's block), a missed copy-on-write or a stale block table shows
up as wrong content under a position some row attends to. A sliding group's
row reads only its window, so table entries behind it may be stale or the
null block, as the contract allows; every other entry must be right.

:class:`HashRegistry` re-derives every block hash, :class:`FcfsWaitBound`
bounds waits under fcfs, and the ``check_*`` functions are the invariants
checked between steps.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from paged_core.memory.hashing import ROOT_HASH, BlockHashFn
from paged_core.sched.output import RequestUpdate, SchedulerOutput
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler

COVERAGE: Counter[str] = Counter()
"""How often the hard paths ran (the state-machine tests assert each one did)."""

KV = tuple[int, int, int]
"""What a slot holds: (KV-cache group, token id, position)."""


def first_visible(window: int | None, num_computed: int) -> int:
    """The first position a query at ``num_computed`` or later attends to (``None``: full attention)."""
    return 0 if window is None else max(0, num_computed - window + 1)


@dataclass
class Row:
    """The runner's view of one request: its known tokens, one block table per group, and where its latest
    step started (table entries behind the windows of that step are never read again: they may be stale)."""

    tokens: list[int]
    tables: list[list[int]] = field(default_factory=list)
    start: int = 0


class FakeRunner:
    """Plays the model runner: applies an output, writes fake KV, checks what attention would read.

    ``windows[g]`` is group ``g``'s sliding window (``None``: full attention).
    """

    def __init__(self, block_size: int, windows: Sequence[int | None] = (None,)) -> None:
        self.bs = block_size
        self.windows = tuple(windows)
        self.content: dict[int, KV] = {}
        self.rows: dict[str, Row] = {}

    def slot(self, table: list[int], pos: int) -> int:
        """The slot of position ``pos`` in a block table (it must cover it)."""
        return table[pos // self.bs] * self.bs + pos % self.bs

    def live_from(self, group: int, num_computed: int) -> int:
        """The first table index of ``group`` that a query at ``num_computed`` or later reads."""
        return first_visible(self.windows[group], num_computed) // self.bs

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
        writer: dict[int, tuple[str, int]] = {}
        for rid, n in out.num_scheduled_tokens.items():
            row, start = self.rows[rid], before[rid]
            seq = seqs[rid]
            assert start + n <= len(seq), f"{rid}: scheduled {n} tokens after {start}, but only {len(seq)} are known"
            for g, table in enumerate(row.tables):
                assert len(table) * self.bs >= start + n, f"{rid}: group {g}'s table {table} cannot hold {start + n}"
                for pos in range(start, start + n):
                    block = table[pos // self.bs]
                    # Copy-on-write: no two rows (nor two groups) may write into one block in a step.
                    who = writer.setdefault(block, (rid, g))
                    assert who == (rid, g), f"block {block} written by {who} and {(rid, g)}"
                    self.content[self.slot(table, pos)] = (g, seq[pos], pos)
        self._check_no_shared_writes(writer)
        for rid, n in out.num_scheduled_tokens.items():
            row, seq = self.rows[rid], seqs[rid]
            for g, table in enumerate(row.tables):
                # The queries at before..before+n-1 see, together, positions from the first one's window on.
                for pos in range(first_visible(self.windows[g], before[rid]), before[rid] + n):
                    got = self.content.get(self.slot(table, pos))
                    assert got == (g, seq[pos], pos), (
                        f"{rid} (group {g}) attends to position {pos} (token {seq[pos]}) in block "
                        f"{table[pos // self.bs]}, which holds {got}; table {table}"
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
        groups = len(self.windows)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.rows, f"{new.req_id} announced as new while the runner still has it"
            assert len(new.block_ids) == groups, f"{new.req_id}: {len(new.block_ids)} tables for {groups} groups"
            self.rows[new.req_id] = Row(list(new.token_ids), [list(t) for t in new.block_ids])
            before[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        assert set(out.replaced_block_ids) <= set(cached.req_ids), "replacements for rows that are not continuing"
        for rid, gained, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True):
            assert rid in self.rows, f"{rid} continues but the runner never saw it as new"
            row = self.rows[rid]
            for g, index, block_id in out.replaced_block_ids.get(rid, ()):
                row.tables[g][index] = block_id
            if gained:  # ``[]``: no group gained a block
                assert len(gained) == groups and any(gained), f"{rid}: gained {gained} for {groups} groups"
                for table, blocks in zip(row.tables, gained, strict=True):
                    table.extend(blocks)
            before[rid] = computed
        assert set(before) == set(out.num_scheduled_tokens), "rows and num_scheduled_tokens disagree"
        for rid, start in before.items():
            row = self.rows[rid]
            row.start = start
            for g, table in enumerate(row.tables):
                live = table[self.live_from(g, start) :]
                assert 0 not in live, f"{rid}: the null block is in group {g}'s window: {table} (from {start})"
        return before

    def _check_no_shared_writes(self, writer: dict[int, tuple[str, int]]) -> None:
        # A block written this step must belong to the writer alone among the rows the runner holds (entries
        # behind a row's windows are never read again: the pool may have handed them on).
        for rid, row in self.rows.items():
            for g, table in enumerate(row.tables):
                for block in table[self.live_from(g, row.start) :]:
                    owner = writer.get(block)
                    assert owner is None or owner == (rid, g), f"{owner} wrote block {block}, which {(rid, g)} holds"


class HashRegistry:
    """Our own hash chain of every request seen, and what each index key means: (group, block index, tokens).

    The chain is computed independently of the manager (salt on block 0,
    chained from ``ROOT_HASH``), so a hash the manager indexes but we never
    derived means its chain or its extra keys are wrong. ``key(group, hash)`` is
    the manager's per-group index key; the group in each slot's fake KV checks
    independently that a group is never served another group's block.
    """

    def __init__(
        self,
        hash_fn: BlockHashFn,
        block_size: int,
        num_groups: int = 1,
        key: Callable[[int, bytes], bytes] | None = None,
    ) -> None:
        self.hash_fn, self.bs = hash_fn, block_size
        self.num_groups = num_groups
        self.key = key or (lambda g, h: h)
        self.chains: dict[str, list[bytes]] = {}
        self.meaning: dict[bytes, tuple[int, int, tuple[int, ...]]] = {}

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
                for g in range(self.num_groups):
                    want = (g, i, block)
                    assert self.meaning.setdefault(self.key(g, chain[-1]), want) == want, "hash collision"


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
    """Free and referenced blocks partition the usable blocks; reference counts match the tables (the null
    block excluded); a block belongs to one group at a time."""
    pool = s.kv.pool
    free = [b.block_id for b in pool.free_queue]
    assert len(free) == len(set(free)) == pool.num_free_blocks, f"free queue corrupt: {free}"
    assert 0 not in free and pool.null_block.ref_cnt == 0, "the null block was handed out"
    assert all(pool.blocks[i].ref_cnt == 0 for i in free), "a block in the free queue is referenced"
    used = [b.block_id for b in pool.blocks[1:] if b.ref_cnt > 0]
    assert len(free) + len(used) == pool.num_usable_blocks, f"{len(free)} free + {len(used)} used blocks"
    holders: Counter[int] = Counter()
    group_of: dict[int, int] = {}
    for rid, tables in s.kv.req_to_blocks.items():
        assert len(tables) == s.kv.groups.num_groups, f"{rid}: {len(tables)} tables"
        ids = [b.block_id for blocks in tables for b in blocks if not b.is_null]
        assert len(ids) == len(set(ids)), f"{rid} holds a block twice: {ids}"
        holders.update(ids)
        for g, blocks in enumerate(tables):
            for b in blocks:
                assert b.is_null == (b.block_id == 0), f"{rid}: {b!r} in group {g}"
                if not b.is_null:
                    assert group_of.setdefault(b.block_id, g) == g, f"{b!r} is in groups {group_of[b.block_id]}, {g}"
    for b in pool.blocks[1:]:
        assert b.ref_cnt == holders[b.block_id], f"{b!r} is held by {holders[b.block_id]} requests"
    assert set(s.kv.req_to_blocks) == {r.request_id for r in s.running}, "only running requests hold blocks"


def check_requests(s: Scheduler, runner: FakeRunner, max_chunk: int) -> None:
    """Statuses, progress counters and block coverage; the runner's rows agree with the scheduler.

    A sliding group's table holds real blocks from the window of the next token to compute to its end (the
    null block only behind it), and at most what its window and a step of ``max_chunk`` tokens (budget and
    lookahead) need; a full group holds no null block.
    """
    running = {r.request_id for r in s.running}
    waiting = {r.request_id for r in s.waiting}
    assert len(running) == len(s.running) and not running & waiting, "a request is queued twice"
    assert running | waiting == set(s.requests), "live requests are neither running nor waiting"
    for r in s.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and r.num_computed_tokens == 0, r
    for r in s.running:
        assert r.status is RequestStatus.RUNNING and 0 <= r.num_computed_tokens < r.num_tokens, r
        tables = s.kv.block_ids(r)
        row = runner.rows.get(r.request_id)  # a fork child is unknown to the runner until first scheduled
        if row is not None:
            assert row.tokens == r.all_token_ids, f"{r}: runner has tokens {row.tokens}"
        for g, table in enumerate(tables):
            assert len(table) * s.block_size >= r.num_computed_tokens, f"{r}: group {g} holds {len(table)} blocks"
            live = runner.live_from(g, r.num_computed_tokens)
            assert 0 not in table[live:], f"{r}: group {g}'s window (from index {live}) lacks a block: {table}"
            window = s.kv.groups.groups[g].window_blocks(s.block_size, max_chunk)
            held = sum(1 for b in table if b)
            assert window is None or held <= window, f"{r}: group {g} holds {held} blocks > {window}: {table}"
            if window is not None and held < len(table):
                COVERAGE["blocks released behind a window"] += 1
            if row is not None:
                # Entries the manager released (0) are never announced: the runner keeps any id there.
                assert len(row.tables[g]) == len(table), f"{r}: runner's group {g} table {row.tables[g]} != {table}"
                mine = [b if b else row.tables[g][i] for i, b in enumerate(table)]
                assert row.tables[g] == mine, f"{r}: runner's group {g} table {row.tables[g]} != {table}"


def check_cached_hashes(s: Scheduler, runner: FakeRunner, registry: HashRegistry) -> None:
    """Every cached hash names a block holding exactly the tokens (and positions) it was computed from."""
    pool, bs = s.kv.pool, s.block_size
    for h, b in pool.cached.items():
        assert b.block_hash == h and not b.is_null, f"index entry {h.hex()[:8]} -> {b!r}"
        assert h in registry.meaning, f"{b!r}: its hash matches no block of any request seen (salt or chain wrong?)"
        g, index, tokens = registry.meaning[h]
        want = [(g, t, index * bs + j) for j, t in enumerate(tokens)]
        assert runner.block_content(b.block_id) == want, f"{b!r} holds {runner.block_content(b.block_id)}, want {want}"
    for b in pool.blocks:
        if b.block_hash is not None:
            assert pool.cached.get(b.block_hash) is b, f"{b!r} keeps a hash the index does not map to it"
    for r in s.running:
        chain = registry.chains[r.request_id]
        assert r.block_hashes == chain[: len(r.block_hashes)], f"{r}: its block hashes differ from ours"
        for g, blocks in enumerate(s.kv.req_to_blocks[r.request_id]):
            for i, b in enumerate(blocks[: r.num_computed_tokens // bs]):
                ok = b.is_null or b.block_hash in (None, registry.key(g, chain[i]))
                assert ok, f"{r}: group {g}'s block {i} ({b!r}) is cached under another prefix or group"
