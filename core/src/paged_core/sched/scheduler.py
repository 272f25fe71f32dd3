"""The scheduler: one token budget per step, running requests first, recompute preemption."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.errors import ConfigError, RequestRejectedError
from paged_core.memory.kv_cache_manager import ExtraKeyProvider, GroupBlocks, KVCacheManager
from paged_core.memory.kv_groups import KVCacheGroups
from paged_core.sched.admission import check_admissible
from paged_core.sched.output import CachedRequestData, NewRequestData, RequestUpdate, SchedulerOutput
from paged_core.sched.queue import FcfsQueue, PriorityQueue
from paged_core.sched.request import Request, RequestStatus

_RUNNING = RequestStatus.RUNNING


class Scheduler:
    """Decides, each step, how many tokens of which requests to compute.

    There are no prefill or decode phases: a request needs
    ``num_tokens_with_spec - num_computed_tokens`` more tokens, and each step
    hands out up to ``max_num_batched_tokens`` of them, running requests
    first, then waiting ones (long prompts are chunked when allowed). When
    blocks run out, a victim (``fcfs``: latest arrival; ``priority``: lowest
    priority, then latest arrival) loses its blocks and goes back to the
    waiting queue, to be recomputed later.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        extra_key_providers: Sequence[ExtraKeyProvider] = (),
        max_loras: int | None = None,
        kv_groups: KVCacheGroups | None = None,
    ) -> None:
        self.config = scheduler_config
        self.max_loras = max_loras
        """At most this many distinct LoRA adapters run at once (``None``: adapters are not served)."""
        self.kv = KVCacheManager(cache_config, extra_key_providers, kv_groups)
        self.block_size = self.kv.block_size
        # A request can never outgrow the whole cache, so that is a length cap too (sliding groups hold only
        # their window: a model whose every layer slides is capped by max_model_len alone).
        max_model_len = scheduler_config.require_resolved("Scheduler")
        self.max_len = _longest_fitting(self.kv, max_model_len, scheduler_config.num_lookahead_tokens)
        if self.max_len < 1:
            raise ConfigError(
                f"a KV cache of {self.kv.pool.num_usable_blocks} blocks of {self.block_size} cannot hold one "
                f"request's sliding windows and {scheduler_config.num_lookahead_tokens} lookahead slots "
                f"({self.kv.blocks_needed(max_model_len, 1 + scheduler_config.num_lookahead_tokens)} blocks)"
            )
        self._sliding = self.kv.groups.has_sliding
        self.waiting: FcfsQueue | PriorityQueue = (
            PriorityQueue() if scheduler_config.policy == "priority" else FcfsQueue()
        )
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._unannounced: set[str] = set()
        self._finished_ids: set[str] = set()
        self.num_preemptions = 0

    # ---- admission ----------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request, or raise :class:`RequestRejectedError` if it can never run."""
        self.check_admissible(req)
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.add(req)

    def fork(self, parent_id: str, child_id: str, last_token_id: int | None = None) -> Request:
        """Start ``child_id`` as a copy of a running request, sharing its blocks copy-on-write.

        ``last_token_id`` replaces the child's last token when that token is
        not yet computed (a different sample for ``n > 1``, or a beam).
        """
        parent = self.requests.get(parent_id)
        if parent is None or parent.status is not _RUNNING:
            raise ValueError(f"can only fork a running request; {parent_id!r} is not running")
        if child_id in self.requests:
            raise RequestRejectedError(f"request id {child_id!r} is already in use")
        if len(self.running) >= self.config.max_num_seqs:
            # Batches never exceed max_num_seqs rows (static buffers are sized by it).
            raise RequestRejectedError(
                f"cannot fork {parent_id!r}: {len(self.running)} requests already running "
                f"(max_num_seqs={self.config.max_num_seqs})"
            )
        child = parent.clone(child_id)
        child.all_token_ids = list(parent.all_token_ids)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        if last_token_id is not None:
            if parent.num_computed_tokens >= parent.num_tokens:
                raise ValueError(f"{parent_id!r}: its last token is already computed and cannot be replaced")
            child.all_token_ids[-1] = last_token_id
        # Only computed full blocks are certainly identical to the parent's.
        child.block_hashes = parent.block_hashes[: child.num_computed_tokens // self.block_size]
        self.kv.fork(parent, child)
        child.status = _RUNNING
        self.requests[child_id] = child
        self.running.append(child)
        self._unannounced.add(child_id)
        return child

    def fork_sampled(self, parent_id: str, child_id: str, token_id: int) -> RequestUpdate:
        """Fork ``child_id`` ending in its own sampled ``token_id`` (``n > 1``), which meets the stop rules.

        Raises as :meth:`fork` does. The update says whether that one token already ended the child (then it is
        freed at once) and carries the parent's prefix-cache hit, which the child shares.
        """
        child = self.fork(parent_id, child_id, last_token_id=token_id)
        status = child.check_stop(token_id, self.max_len)
        if status is not None:
            self.abort([child_id], status=status)
        reason = status.value if status is not None else None
        return RequestUpdate(child_id, [token_id], reason, max(child.num_cached_tokens, 0))

    def check_admissible(self, req: Request) -> None:
        """Raise :class:`RequestRejectedError` if ``req`` could never run here (nothing is queued)."""
        check_admissible(req, self.config, self.kv, self.requests, self.max_len)

    def abort(self, request_ids: Sequence[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list[str]:
        """End requests by id and free their blocks (unknown ids are ignored); returns the ids actually ended.

        ``status`` records why: aborted by the client (the default), or a stop
        rule the engine detected outside the scheduler (a stop string).
        """
        if not status.is_finished:
            raise ValueError(f"abort needs a finished status, got {status}")
        done = []
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            if req.status is _RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self.kv.free(req)
            req.status = status
            self._unannounced.discard(rid)
            self._finished_ids.add(rid)
            done.append(rid)
        return done

    # ---- writes from the engine core -------------------------------------
    def set_drafts(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Draft tokens to verify after ``request_id``'s last token in its next step (speculative decoding).

        Only a running request whose last token is its one uncomputed token takes drafts; the update
        that follows the step keeps the accepted ones and drops the rest.
        """
        req = self.requests.get(request_id)
        if req is None or req.status is not _RUNNING or req.num_computed_tokens != req.num_tokens - 1:
            raise ValueError(f"{request_id!r} is not about to decode: it cannot take drafts")
        req.spec_token_ids = list(token_ids)

    def append_token(self, request_id: str, token_id: int) -> None:
        """Append a token chosen outside the sampler (a beam's) to a request whose last token has run.

        What :meth:`update_from_output` does for a sampled token, minus its stop rules: the caller (beam
        search) decides when the request ends. The request may have been preempted since its row ran
        (it then recomputes this token with the rest).
        """
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"cannot extend {request_id!r}: no such request")
        req.all_token_ids.append(token_id)

    # ---- reads --------------------------------------------------------
    def is_running(self, request_id: str) -> bool:
        """Whether ``request_id`` holds a batch row now (so it can be forked)."""
        req = self.requests.get(request_id)
        return req is not None and req.status is _RUNNING

    def num_cached_tokens(self, request_id: str) -> int | None:
        """The prefix-cache hit of ``request_id`` at its first admission (0 before; ``None`` if unknown)."""
        req = self.requests.get(request_id)
        return None if req is None else max(req.num_cached_tokens, 0)

    def block_ids(self, request_id: str) -> list[list[int]]:
        """The KV blocks ``request_id`` holds per KV-cache group, in table order (none if unknown)."""
        req = self.requests.get(request_id)
        return [] if req is None else self.kv.block_ids(req)

    def about_to_decode(self) -> list[Request]:
        """The running requests whose last token is their one uncomputed token: the next step samples after it."""
        return [r for r in self.running if r.num_computed_tokens == r.num_tokens - 1]

    # ---- one step -----------------------------------------------------
    def schedule(self, overlap: bool = False) -> SchedulerOutput:
        """Plan one step and advance ``num_computed_tokens`` of every scheduled request.

        ``overlap``: the previous step is still running and its tokens are not applied yet (asynchronous
        scheduling). Each running request that step samples for gets one placeholder token, scheduled now
        like a known one and named in ``placeholder_req_ids``; the core fills it in before this plan runs,
        and :meth:`update_from_output` of the previous step (given this plan as ``in_flight``) appends it.
        """
        if overlap:
            for req in self.running:
                if req.num_computed_tokens >= len(req.all_token_ids) and not req.spec_token_ids:
                    req.num_output_placeholders = 1
        kv, max_len = self.kv, self.max_len
        budget = self.config.max_num_batched_tokens
        has_lookahead = self.config.num_lookahead_tokens > 0
        num_sched: dict[str, int] = {}
        # (request, tokens, blocks gained; None for rows the runner does not know yet)
        scheduled: list[tuple[Request, int, GroupBlocks | None]] = []
        preempted: list[str] = []
        running = self.running

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = (
                len(req.all_token_ids) + len(req.spec_token_ids) + req.num_output_placeholders - req.num_computed_tokens
            )
            if num_new > budget:
                num_new = budget
            if req.spec_token_ids and req.num_computed_tokens + num_new > max_len:
                num_new = max_len - req.num_computed_tokens  # drafts never run past the length cap
            if self._sliding and num_new > 1:
                num_new = kv.max_chunk(req.num_computed_tokens, num_new, self.config.num_lookahead_tokens, max_len)
            if num_new <= 0:
                i += 1
                continue
            lookahead = self._lookahead(req.num_computed_tokens + num_new) if has_lookahead else 0
            new_blocks = kv.allocate_slots(req, num_new, num_lookahead_tokens=lookahead)
            while new_blocks is None:
                victim = self._pick_victim()
                vi = running.index(victim)
                self._preempt(victim, vi)
                preempted.append(victim.request_id)
                if victim.request_id in num_sched:
                    budget += num_sched.pop(victim.request_id)
                if victim is req:
                    break
                if vi < i:
                    i -= 1
                new_blocks = kv.allocate_slots(req, num_new, num_lookahead_tokens=lookahead)
            if new_blocks is None:
                continue  # req itself was preempted; running[i] is now the next one
            num_sched[req.request_id] = num_new
            scheduled.append((req, num_new, new_blocks))
            budget -= num_new
            i += 1

        if preempted:
            # Rare: drop rows whose request became a victim after being scheduled.
            scheduled = [row for row in scheduled if row[0].status is _RUNNING]
        else:
            # Admit waiting requests only when memory was not short (admitting now would only thrash).
            self._admit(budget, num_sched, scheduled)
        return self._build_output(num_sched, scheduled, preempted)

    def _admit(
        self,
        budget: int,
        num_sched: dict[str, int],
        scheduled: list[tuple[Request, int, GroupBlocks | None]],
    ) -> None:
        cfg, kv, waiting = self.config, self.kv, self.waiting
        in_flight = _blocks_in_flight(scheduled, kv.block_size) if kv.enable_caching and waiting else set()
        loras = {r.lora_id for r in self.running if r.lora_id is not None} if self.max_loras else set()
        while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting.peek()
            if loras and req.lora_id is not None and req.lora_id not in loras and len(loras) >= (self.max_loras or 0):
                # Every adapter slot is taken by running requests: the first waiting request that needs no new
                # adapter goes ahead (the others keep their place in the queue).
                fits = next((r for r in waiting if r.lora_id is None or r.lora_id in loras), None)
                if fits is None:
                    break
                req = fits
            hits, num_hit = kv.get_computed_blocks(req)
            nxt = num_hit // kv.block_size
            if in_flight and nxt < (req.num_tokens - 1) // kv.block_size and req.block_hashes[nxt] in in_flight:
                # A row of this step is computing the block this request would compute next: it waits one
                # step and gets it from the cache (a burst of prompts sharing a prefix computes it once).
                break
            num_new = req.num_tokens - num_hit
            if num_new > budget:
                # A resumed request may have outgrown one step's budget: it recomputes in chunks.
                if not cfg.enable_chunked_prefill and req.num_preemptions == 0:
                    break
                num_new = budget
            if self._sliding:
                num_new = kv.max_chunk(num_hit, num_new, cfg.num_lookahead_tokens, self.max_len)
                if num_new <= 0:
                    break
            if kv.allocate_slots(req, num_new, hits, self._lookahead(num_hit + num_new)) is None:
                break
            if req is waiting.peek():
                waiting.pop()
            else:
                waiting.remove(req)
            req.status = _RUNNING
            if req.lora_id is not None and self.max_loras:
                loras.add(req.lora_id)
            req.num_computed_tokens = num_hit
            req.num_output_placeholders = 0  # a preempted request got its owed token before it could wait here
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            self.running.append(req)
            num_sched[req.request_id] = num_new
            scheduled.append((req, num_new, None))
            budget -= num_new
            if kv.enable_caching:
                in_flight |= _blocks_in_flight([scheduled[-1]], kv.block_size)

    def _build_output(
        self,
        num_sched: dict[str, int],
        scheduled: list[tuple[Request, int, GroupBlocks | None]],
        preempted: list[str],
    ) -> SchedulerOutput:
        kv = self.kv
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        cached_ids, cached_blocks, cached_computed = cached.req_ids, cached.new_block_ids, cached.num_computed_tokens
        cached_tokens = cached.new_token_ids
        spec: dict[str, list[int]] = {}
        unannounced = self._unannounced
        copies, replaced = kv.take_copies()
        placeholders: list[str] = []
        total = 0
        for req, n, gained in scheduled:
            rid = req.request_id
            known = len(req.all_token_ids) + req.num_output_placeholders
            if req.num_output_placeholders:
                placeholders.append(rid)
            if gained is None or (unannounced and rid in unannounced):
                unannounced.discard(rid)
                replaced.pop(rid, None)  # a new row's block_ids are already final
                block_ids = kv.block_ids(req)
                new_reqs.append(
                    NewRequestData(rid, list(req.all_token_ids), block_ids, req.num_computed_tokens, req.lora)
                )
            else:
                cached_ids.append(rid)
                cached_blocks.append([[b.block_id for b in blocks] for blocks in gained] if gained else [])
                cached_computed.append(req.num_computed_tokens)
                cached_tokens.append(req.all_token_ids[req.num_announced_tokens :])
            req.num_announced_tokens = known
            computed = req.num_computed_tokens + n
            if computed > known:
                spec[rid] = req.spec_token_ids[: computed - known]
            req.num_computed_tokens = computed
            total += n
        finished, self._finished_ids = self._finished_ids, set()
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_sched,
            total_num_scheduled_tokens=total,
            scheduled_spec_decode_tokens=spec,
            block_copies=copies,
            replaced_block_ids=replaced,
            finished_req_ids=finished,
            preempted_req_ids=preempted,
            placeholder_req_ids=placeholders,
        )

    def _lookahead(self, end: int) -> int:
        """Lookahead slots after ``end``; none past the length cap (never written, and they could
        make a request that fits the cache unschedulable)."""
        return max(0, min(self.config.num_lookahead_tokens, self.max_len - end))

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=Request.priority_key)
        return max(self.running, key=Request.order_key)

    def _preempt(self, req: Request, index: int) -> None:
        del self.running[index]
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._unannounced.discard(req.request_id)
        self.waiting.prepend(req)

    # ---- after the step ran --------------------------------------------
    def update_from_output(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Mapping[str, Sequence[int]],
        in_flight: SchedulerOutput | None = None,
    ) -> list[RequestUpdate]:
        """Apply a step's sampled tokens: accept speculation, append, stop, free finished requests.

        ``sampled_token_ids[rid]`` holds the tokens produced for a request that
        reached the end of its known tokens this step (one, or for speculative
        decoding the accepted drafts plus one). Rows still mid-prefill produce
        nothing and any tokens given for them are ignored. ``in_flight`` is the
        plan scheduled after ``output`` that is running now (asynchronous
        scheduling): its tokens are not computed yet, so its blocks are not
        cached, and a request it preempted still takes the token it was owed.
        """
        kv, requests, max_len, bs = self.kv, self.requests, self.max_len, self.block_size
        spec = output.scheduled_spec_decode_tokens
        num_cached = kv.num_cached_blocks if kv.enable_caching else None
        ahead = in_flight.num_scheduled_tokens if in_flight is not None else {}
        updates: list[RequestUpdate] = []
        any_finished = False
        for rid in output.num_scheduled_tokens:
            req = requests.get(rid)
            if req is None:
                continue  # aborted since the step was planned
            toks = sampled_token_ids.get(rid)
            if req.status is not _RUNNING:
                if toks and req.num_output_placeholders:  # preempted by the plan in flight, after this step ran
                    updates.append(self._owed_token(req, toks[0]))
                continue
            if spec:
                drafts = spec.get(rid)
                if drafts:
                    accepted = len(toks) - 1 if toks else 0
                    req.num_computed_tokens -= len(drafts) - accepted
                    req.spec_token_ids = []
            # What this step computed (the plan in flight has already advanced the count past it).
            computed = req.num_computed_tokens - ahead.get(rid, 0) if ahead else req.num_computed_tokens
            # Cheap pre-check: index new full blocks only when one was completed.
            if num_cached is not None and computed // bs > num_cached.get(rid, 0):
                self._cache_blocks(req, computed)
            if not toks or computed < len(req.all_token_ids):
                continue
            req.num_output_placeholders = 0
            status = None
            appended = 0
            for t in toks:
                req.all_token_ids.append(t)
                appended += 1
                status = req.check_stop(t, max_len)
                if status is not None:
                    break
            cached = max(req.num_cached_tokens, 0)
            if status is None:
                updates.append(RequestUpdate(rid, list(toks), num_cached_tokens=cached))
                continue
            req.status = status
            any_finished = True
            kv.free(req)
            del requests[rid]
            self._finished_ids.add(rid)
            updates.append(RequestUpdate(rid, list(toks[:appended]), status.value, cached))
        if any_finished:
            self.running = [r for r in self.running if r.status is _RUNNING]
        return updates

    def _cache_blocks(self, req: Request, computed: int) -> None:
        """Index ``req``'s full blocks among its first ``computed`` tokens (a plan in flight may count more)."""
        ahead = req.num_computed_tokens
        if ahead == computed:
            self.kv.cache_computed_blocks(req)
            return
        req.num_computed_tokens = computed
        try:
            self.kv.cache_computed_blocks(req)
        finally:
            req.num_computed_tokens = ahead

    def _owed_token(self, req: Request, token_id: int) -> RequestUpdate:
        """Append the token a preempted request's last step sampled (it was waiting for it when preempted)."""
        req.num_output_placeholders = 0
        req.all_token_ids.append(token_id)
        status = req.check_stop(token_id, self.max_len)
        cached = max(req.num_cached_tokens, 0)
        if status is None:
            return RequestUpdate(req.request_id, [token_id], num_cached_tokens=cached)
        self.waiting.remove(req)
        del self.requests[req.request_id]
        req.status = status
        self._finished_ids.add(req.request_id)
        return RequestUpdate(req.request_id, [token_id], status.value, cached)

    # ---- views --------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache; refuses (False) while any request holds blocks."""
        return self.kv.reset_prefix_cache()


def _blocks_in_flight(rows: Sequence[tuple[Request, int, object]], block_size: int) -> set[bytes]:
    """Hashes of the full prompt blocks that these rows compute (wholly or in part) in this step."""
    out: set[bytes] = set()
    for req, n, _ in rows:
        first, end = req.num_computed_tokens // block_size, -(-(req.num_computed_tokens + n) // block_size)
        out.update(req.block_hashes[first:end])
    return out


def _longest_fitting(kv: KVCacheManager, max_model_len: int, lookahead: int) -> int:
    """The longest request (at most ``max_model_len`` tokens) whose blocks the whole cache holds, decoding with
    ``lookahead`` slots (which never pass the cap, but widen what a sliding window holds)."""
    usable, chunk = kv.pool.num_usable_blocks, 1 + lookahead
    if kv.blocks_needed(max_model_len, chunk) <= usable:
        return max_model_len
    lo, hi = 0, max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv.blocks_needed(mid, chunk) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo
