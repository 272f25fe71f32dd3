"""Beam search inside the engine core: live beams are scheduler requests that share KV blocks copy-on-write.

A group starts as one request (the prompt). Each search step takes the top ``K = max(2, 1 + #eos) x width``
continuations over all live beams (``log_softmax`` of each beam's logits row plus its cumulative
log-probability), keeps the best ``width`` that do not end, and turns them into beams: a parent's first
kept continuation extends the parent's own request, each further one is a
:meth:`~paged_core.sched.scheduler.Scheduler.fork` (blocks shared by reference, copied only when a beam
writes into a shared block), and a parent with none is aborted so its blocks go back at once.
Continuations that end (an EOS id, or the length limit) among the top ``width`` become finished
hypotheses scored ``sum_logprobs / generated_len**length_penalty`` (the EOS token counted), of which the
best ``width`` are kept. The search ends as transformers' ``generate(num_beams=W, do_sample=False)`` does
(its ``early_stopping`` rules, see :func:`BeamGroup._still_open`), and its output is the same tokens.

Beams need not all be scheduled in the same step (preemption, a fork that found no free row): a row is
kept until every live beam of its group has one, and only then does the group step. A group is started
only while the live groups' widths fit ``max_num_seqs``, so idle beams waiting for a sibling can never hold
every row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch

from paged_core.engine_core.beam_params import BeamParams, BeamResult
from paged_core.engine_core.messages import CoreRequest, SeqDelta
from paged_core.engine_core.rows import Rows
from paged_core.errors import RequestRejectedError
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler

log = logging.getLogger("paged.engine")


class _Beam:
    """A live beam: the scheduler request ``seq_id``, its generated tokens and their summed log-probability."""

    __slots__ = ("logprob", "row", "seq_id", "tokens")

    def __init__(self, seq_id: str, tokens: list[int], logprob: torch.Tensor) -> None:
        self.seq_id = seq_id
        self.tokens = tokens
        self.logprob = logprob  # a 0-d float32 tensor: sums and comparisons round as transformers' do
        self.row: torch.Tensor | None = None  # log_softmax of the next-token logits, once computed


class _Hypothesis:
    __slots__ = ("eos", "logprob", "score", "tokens")

    def __init__(self, tokens: list[int], logprob: float, score: float, eos: bool) -> None:
        self.tokens = tokens
        self.logprob = logprob
        self.score = score
        self.eos = eos


class BeamGroup:
    """One beam-search request: its live beams, finished hypotheses and stopping state (no scheduler calls)."""

    def __init__(self, request: CoreRequest, beam: BeamParams, eos_ids: Iterable[int], max_new: int) -> None:
        self.request = request
        self.width = beam.width
        self.length_penalty = float(beam.length_penalty)
        self.early_stopping = beam.early_stopping
        self.eos = frozenset(eos_ids)
        self.keep = max(2, 1 + len(self.eos)) * self.width
        self.max_new = max_new
        self.min_tokens = request.params.min_tokens
        self.running: list[_Beam] = []
        self.finished: list[_Hypothesis] = []
        self.gen_len = 0
        self.open = True  # transformers' is_early_stop_heuristic_unsatisfied
        self.done = False
        self.next_id = 0
        self.num_cached_tokens = -1
        self.peak_blocks = 0
        self.peak_blocks_unshared = 0
        self.forks = 0

    def new_seq_id(self) -> str:
        sid = f"{self.request.request_id}#beam{self.next_id}"
        self.next_id += 1
        return sid

    @property
    def ready(self) -> bool:
        return bool(self.running) and all(b.row is not None for b in self.running)

    def step(self) -> list[tuple[_Beam, int, torch.Tensor]]:
        """One search step over the collected rows: the next live beams as ``(parent, token, logprob)``, best first.

        Finished hypotheses are updated and :attr:`done` set when the search is over (then nothing continues).
        """
        running, width, lp = self.running, self.width, self.length_penalty
        rows = torch.stack([b.row for b in running if b.row is not None])
        if self.gen_len < self.min_tokens and self.eos:
            rows[:, sorted(self.eos)] = float("-inf")  # transformers' min_new_tokens processor, after log_softmax
        acc = (rows + torch.stack([b.logprob for b in running])[:, None]).flatten()
        vals, idx = torch.topk(acc, min(self.keep, acc.numel()))
        vocab = rows.shape[1]
        new_len = self.gen_len + 1
        at_limit = new_len >= self.max_new
        cands = [(running[i // vocab], i % vocab, vals[r]) for r, i in enumerate(idx.tolist())]
        ends = [at_limit or tok in self.eos for _, tok, _ in cands]
        nxt = [c for c, end in zip(cands, ends, strict=True) if not end][:width]
        full = self.early_stopping is True and len(self.finished) >= width
        if self.open and not full:
            # Only the top ``width`` candidates may finish; the rest only back up the live beams.
            for (parent, tok, val), end in zip(cands[:width], ends[:width], strict=True):
                if end:
                    score = val / (new_len**lp)
                    hyp = _Hypothesis([*parent.tokens, tok], float(val), float(score), tok in self.eos)
                    self.finished.append(hyp)
            self.finished.sort(key=lambda h: -h.score)
            del self.finished[width:]
        self.gen_len = new_len
        self.open = self._still_open(nxt[0][2] if nxt else None)
        stop_full = self.early_stopping is True and len(self.finished) >= width
        if not self.open or stop_full or not nxt:
            self.done = True
            return []
        return nxt

    def _still_open(self, best_running: torch.Tensor | None) -> bool:
        """Can a live beam still beat the worst kept hypothesis? transformers' early-stop heuristic, kept sticky.

        ``early_stopping`` False judges the best live beam at its current length; "never" (with a positive
        length penalty) at the longest it could grow to.
        """
        if not self.open:
            return False
        if len(self.finished) < self.width or best_running is None:
            return len(self.finished) < self.width
        lp = self.length_penalty
        length = self.max_new if self.early_stopping == "never" and lp > 0.0 else self.gen_len
        best = best_running / (length**lp)
        return bool(best > min(h.score for h in self.finished))

    def results(self) -> list[_Hypothesis]:
        """The finished hypotheses, best first (``n`` of them are returned)."""
        return self.finished[: self.request.params.n]


class BeamSearch:
    """The core's beam groups: rows in, tokens, forks and aborts out through the scheduler.

    :meth:`take` keeps the beams' logits rows of a step (:meth:`owns` picks them out); :meth:`advance`,
    after the scheduler's update, steps every group whose beams all have rows and returns the deltas of
    groups that finished (one per returned sequence, whole, with scores). Every change to a beam's
    request (a token, a fork, an abort) is a scheduler call.
    """

    def __init__(self, scheduler: Scheduler, eos_token_ids: Sequence[int], vocab_size: int) -> None:
        self.scheduler = scheduler
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = vocab_size
        self.groups: dict[str, BeamGroup] = {}
        self.pending: list[BeamGroup] = []  # waiting for rows to fit max_num_seqs
        self.owner: dict[str, BeamGroup] = {}  # scheduler request id -> group
        self._failed: dict[str, str] = {}  # queued groups that could not start, reported by the next advance

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.groups

    def __bool__(self) -> bool:
        return bool(self.groups)

    # ---- requests ---------------------------------------------------------
    def add(self, request: CoreRequest, beam: BeamParams) -> None:
        """Queue a beam-search request (checked by the caller); it starts once its width fits the free rows."""
        params = request.params
        eos = () if params.ignore_eos else self.eos_token_ids
        eos_ids = set(eos) | set(params.stop_token_ids or ())
        sched = self.scheduler
        room = sched.max_len - len(request.prompt_token_ids)
        group = BeamGroup(request, beam, eos_ids, max(1, min(params.max_tokens, room)))
        # Refused now if it could never run, even when it has to wait for rows before it starts.
        sched.check_admissible(self._request(group, group.new_seq_id(), request.prompt_token_ids))
        self.groups[request.request_id] = group
        self.pending.append(group)
        self._start_pending()

    def _start_pending(self) -> dict[str, str]:
        """Start the queued groups whose width fits beside the live groups'; those that could not start."""
        live = sum(g.width for g in self.groups.values() if g not in self.pending)
        limit = self.scheduler.config.max_num_seqs
        failures = {}
        while self.pending and live + self.pending[0].width <= limit:
            group = self.pending.pop(0)
            live += group.width
            sid = group.new_seq_id()
            try:
                self.scheduler.add_request(self._request(group, sid, group.request.prompt_token_ids))
            except RequestRejectedError as exc:
                self.groups.pop(group.request.request_id, None)
                failures[group.request.request_id] = str(exc)
                continue
            group.running.append(_Beam(sid, [], torch.zeros((), dtype=torch.float32)))
            self.owner[sid] = group
        return failures

    def _request(self, group: BeamGroup, seq_id: str, token_ids: list[int]) -> Request:
        """A scheduler request for a beam: stops are the search's business, so the scheduler never ends it."""
        req = group.request
        room = group.max_new - (len(token_ids) - len(req.prompt_token_ids))
        return Request(
            seq_id,
            token_ids,
            max_tokens=max(1, room),
            ignore_eos=True,
            priority=req.priority,
            cache_salt=req.cache_salt,
        )

    def abort(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> bool:
        """End a group and free its beams' blocks; False if no such group."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return False
        if group in self.pending:
            self.pending.remove(group)
        self._drop(group, group.running, status)
        group.running = []
        self._failed.update(self._start_pending())
        return True

    def _drop(self, group: BeamGroup, beams: Iterable[_Beam], status: RequestStatus) -> None:
        ids = [b.seq_id for b in beams]
        self.scheduler.abort(ids, status=status)
        for sid in ids:
            self.owner.pop(sid, None)

    def request_ids(self, seq_ids: Iterable[str]) -> list[str]:
        """The beam requests owning any of these scheduler ids (a failed step names them)."""
        return list(dict.fromkeys(g.request.request_id for sid in seq_ids if (g := self.owner.get(sid)) is not None))

    # ---- one step -----------------------------------------------------------
    def owns(self, seq_id: str, count: int = 1) -> bool:
        """Whether a step's row (``count`` logits rows long) is a beam's; beams never take drafts, so it has one."""
        return seq_id in self.owner

    def take(self, rows: Rows) -> None:
        """Keep the beams' rows of a step, as fp32 ``log_softmax`` (as transformers scores them)."""
        if not rows:
            return
        assert rows.logits is not None
        scores = torch.log_softmax(rows.logits[:, : self.vocab_size].float(), dim=-1)
        for j, sid in enumerate(rows.req_ids):
            group = self.owner[sid]
            beam = next(b for b in group.running if b.seq_id == sid)
            beam.row = scores[j]
            if group.num_cached_tokens < 0 and (cached := self.scheduler.num_cached_tokens(sid)) is not None:
                group.num_cached_tokens = cached

    def advance(self) -> tuple[list[SeqDelta], dict[str, str]]:
        """Step every group whose beams all have rows; the deltas of finished groups and the groups that failed."""
        deltas: list[SeqDelta] = []
        failures, self._failed = self._failed, {}
        for rid, group in list(self.groups.items()):
            if not group.ready:
                continue
            try:
                self._count_blocks(group)
                nxt = group.step()
                if group.done:
                    deltas += self._finish(group)
                else:
                    self._apply(group, nxt)
            except Exception as exc:
                log.error("request %s: its beam search step failed; ending it alone", rid, exc_info=exc)
                failures[rid] = f"beam search failed for this request ({type(exc).__name__})"
        failures.update(self._start_pending())
        return deltas, failures

    def _count_blocks(self, group: BeamGroup) -> None:
        tables = [[i for t in self.scheduler.block_ids(b.seq_id) for i in t if i] for b in group.running]
        group.peak_blocks = max(group.peak_blocks, len(set().union(*tables)) if tables else 0)
        group.peak_blocks_unshared = max(group.peak_blocks_unshared, sum(len(t) for t in tables))

    def _apply(self, group: BeamGroup, nxt: list[tuple[_Beam, int, torch.Tensor]]) -> None:
        """Turn the kept continuations into beams: extend, fork, and abort the parents left without any."""
        sched = self.scheduler
        kept = {id(parent) for parent, _, _ in nxt}
        self._drop(group, [b for b in group.running if id(b) not in kept], RequestStatus.FINISHED_STOPPED)
        extended: set[int] = set()
        forks: list[tuple[_Beam, _Beam, int]] = []
        running = []
        for parent, tok, val in nxt:
            if id(parent) not in extended:
                extended.add(id(parent))
                beam = _Beam(parent.seq_id, [*parent.tokens, tok], val)
                sched.append_token(parent.seq_id, tok)  # the search's own stop rules, not the scheduler's
            else:
                beam = _Beam(group.new_seq_id(), [*parent.tokens, tok], val)
                forks.append((parent, beam, tok))
            running.append(beam)
        group.running = running  # before the forks: if one fails, aborting the group frees every beam
        # Forks last: each parent's request already ends in its own new token, which the child replaces.
        for parent, child, tok in forks:
            self.owner[child.seq_id] = group
            if sched.is_running(parent.seq_id):
                try:
                    sched.fork(parent.seq_id, child.seq_id, last_token_id=tok)
                    group.forks += 1
                    continue
                except Exception as exc:  # no free row: run on its own (its prefix still comes from the cache)
                    log.debug("beam fork of %s refused (%s); queueing it on its own", parent.seq_id, exc)
            prompt = list(group.request.prompt_token_ids) + child.tokens
            sched.add_request(self._request(group, child.seq_id, prompt))

    def _finish(self, group: BeamGroup) -> list[SeqDelta]:
        rid = group.request.request_id
        self._drop(group, group.running, RequestStatus.FINISHED_STOPPED)
        group.running = []
        self.groups.pop(rid, None)
        deltas = []
        for i, hyp in enumerate(group.results()):
            result = BeamResult(hyp.logprob, hyp.score, group.peak_blocks, group.peak_blocks_unshared, group.forks)
            deltas.append(
                SeqDelta(
                    rid,
                    i,
                    list(hyp.tokens),
                    finish_reason="stop" if hyp.eos else "length",
                    stop_reason=hyp.tokens[-1] if hyp.eos else None,
                    num_cached_tokens=group.num_cached_tokens if i == 0 else -1,
                    beam=result,
                )
            )
        return deltas
