"""Sampled requests inside the core: each is a group of ``n`` sequences, each sequence one scheduler request.

A group starts as one sequence. Its prompt is computed once: the first step that reaches the
prompt's end draws all ``n`` first tokens from that one row, and siblings ``1..n-1`` are forked from
sequence 0 after the scheduler's update (sharing its blocks copy-on-write; a fork that finds no free
row runs on its own, its prompt blocks from the prefix cache). The group leaves the core when all
``n`` have ended.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from paged_core.engine_core.grammars import Grammars
from paged_core.engine_core.messages import CoreRequest, SeqDelta
from paged_core.engine_core.rows import Rows
from paged_core.errors import RequestRejectedError
from paged_core.sampling.isolate import sample_isolated
from paged_core.sampling.logprobs import TokenLogprobs
from paged_core.sampling.sampler import Sampler, SamplingState
from paged_core.sched.output import RequestUpdate
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler
from paged_core.structured import GrammarMatcher

log = logging.getLogger("paged.engine")

TokenLogprobDict = dict[int, float]
"""A sampled token's logprob plus the requested top alternatives, keyed by token id (as :class:`SeqDelta` holds)."""


class Group:
    """A request inside the core: its ``n`` sequences and what they share."""

    __slots__ = ("done", "forked", "request", "seqs")

    def __init__(self, request: CoreRequest) -> None:
        self.request = request
        self.seqs: dict[int, Seq] = {}
        self.forked = request.params.n == 1  # a request with n > 1 forks its siblings once, off its first row
        self.done = 0


class Seq:
    """One sampled sequence, scheduled under ``seq_id``."""

    __slots__ = ("first", "group", "index", "matcher", "seq_id", "state")

    def __init__(self, group: Group, index: int, state: SamplingState, matcher: GrammarMatcher | None = None) -> None:
        rid = group.request.request_id
        self.group = group
        self.index = index
        self.seq_id = rid if group.request.params.n == 1 else f"{rid}#{index}"
        self.state = state
        self.first = True  # no token reported yet: the first delta carries the prefix-cache hit
        self.matcher = matcher
        """Its place in its grammar (structured outputs), or ``None`` when unconstrained."""

    @property
    def request_id(self) -> str:
        return self.group.request.request_id


@dataclass(slots=True)
class _Fork:
    """Siblings to fork after the update: the parent and the first tokens (and logprobs) of sequences 1..n-1."""

    parent: Seq
    token_ids: list[int]
    logprobs: list[TokenLogprobDict] | None


@dataclass(slots=True)
class Sampled:
    """What sampling a step's rows gave: tokens per scheduler id, their logprobs, pending forks and failures."""

    token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobDict]] = field(default_factory=dict)
    forks: list[_Fork] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


class SampledGroups:
    """The core's sampled requests: rows in through the sampler, tokens out through the scheduler's update.

    :meth:`sample` draws the tokens of a step's rows (a row the sampler cannot serve fails its request
    alone); after the scheduler's update, :meth:`emit` turns its :class:`RequestUpdate` into deltas and
    forks the siblings of ``n > 1`` requests.
    """

    def __init__(
        self, scheduler: Scheduler, sampler: Sampler, eos_token_ids: Iterable[int], grammars: Grammars | None = None
    ) -> None:
        self.scheduler = scheduler
        self.sampler = sampler
        self.eos_token_ids = tuple(eos_token_ids)
        self.grammars = grammars
        """Structured outputs: compiles in flight and masks (``None``: constrained requests are refused)."""
        self.groups: dict[str, Group] = {}
        self.seqs: dict[str, Seq] = {}  # scheduler request id -> live sequence

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.groups

    def __bool__(self) -> bool:
        return bool(self.groups)

    # ---- requests ---------------------------------------------------------
    def add(self, request: CoreRequest) -> None:
        """Queue a checked request as its sequence 0 (raises :class:`RequestRejectedError` if it can never run)."""
        group = Group(request)
        state = SamplingState(request.params, request.prompt_token_ids, index=0, eos_token_ids=self.eos_token_ids)
        seq = Seq(group, 0, state)
        spec = request.params.structured_outputs
        if spec is not None:
            if self.grammars is None:
                raise RequestRejectedError("structured_outputs: this engine has no grammar compiler")
            self.scheduler.check_admissible(self._request(seq))
            # Held out of the scheduler until its grammar compiles (:meth:`admit_compiled`).
            self.grammars.submit(request.request_id, spec)
        else:
            self.scheduler.add_request(self._request(seq))
            self.seqs[seq.seq_id] = seq
        group.seqs[0] = seq
        self.groups[request.request_id] = group

    def admit_compiled(self) -> dict[str, str]:
        """Schedule the requests whose grammar compiled since the last step; the failures, by request."""
        if self.grammars is None or not self.grammars.pending:
            return {}
        grammars, failures = self.grammars.ready()
        for rid, grammar in grammars.items():
            group = self.groups.get(rid)
            if group is None:
                continue
            seq = group.seqs[0]
            seq.matcher = grammar.matcher()
            try:
                self.scheduler.add_request(self._request(seq))
            except RequestRejectedError as exc:
                failures[rid] = str(exc)
                continue
            self.seqs[seq.seq_id] = seq
        return failures

    def _request(self, seq: Seq) -> Request:
        """The scheduler's view of one sequence (prompt, limits, stop ids, cache keys)."""
        req = seq.group.request
        params = req.params
        eos = self.eos_token_ids
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids.update(eos[1:])  # the first EOS is the request's own; any others stop too
        return Request(
            seq.seq_id,
            req.prompt_token_ids,
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            stop_token_ids=stop_ids,
            eos_token_id=eos[0] if eos else None,
            ignore_eos=params.ignore_eos,
            priority=req.priority,
            cache_salt=req.cache_salt,
            lora=req.lora,
        )

    def abort(self, request_id: str, status: RequestStatus) -> bool:
        """End a whole request and free its sequences' blocks; False if no such request."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return False
        if self.grammars is not None:
            self.grammars.cancel(request_id)
        for seq in group.seqs.values():
            self.scheduler.abort([seq.seq_id], status=status)
            self.seqs.pop(seq.seq_id, None)
        return True

    def abort_sequence(self, request_id: str, index: int, status: RequestStatus) -> None:
        """End one live sequence of a request (a stop string the front end found); unknown ones are ignored."""
        owner = self.groups.get(request_id)
        seq = owner.seqs.get(index) if owner is not None else None
        if seq is not None and self.seqs.pop(seq.seq_id, None) is not None:
            self.scheduler.abort([seq.seq_id], status=status)
            self._seq_done(seq)

    def request_ids(self, seq_ids: Iterable[str]) -> list[str]:
        """The requests owning any of these scheduler ids (a failed step names them)."""
        return list(dict.fromkeys(seq.request_id for sid in seq_ids if (seq := self.seqs.get(sid)) is not None))

    # ---- one step -----------------------------------------------------------
    def sample(self, rows: Rows) -> Sampled:
        """Draw one token for each row (all ``n`` first tokens from a group's one shared prefill row)."""
        out = Sampled()
        if not rows:
            return out
        assert rows.logits is not None
        seqs = [self.seqs[rid] for rid in rows.req_ids]
        counts = [1 if s.group.forked else s.group.request.params.n for s in seqs]
        constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if constrained and self.grammars is not None:
            self.grammars.mask(rows.logits, constrained, [m for i in constrained if (m := seqs[i].matcher)])
        result, errors = sample_isolated(self.sampler, rows.logits, [s.state for s in seqs], counts)
        for i, exc in errors.items():
            rid = seqs[i].request_id
            log.error("request %s: sampling its row failed; ending it alone", rid, exc_info=exc)
            out.failures[rid] = f"sampling failed for this request ({type(exc).__name__})"
        for seq, toks, lps in zip(seqs, result.token_ids, result.logprobs, strict=True):
            if out.failures and seq.request_id in out.failures:
                continue
            out.token_ids[seq.seq_id] = toks[:1]
            if lps is not None:
                out.logprobs[seq.seq_id] = [as_dict(lps[0])]
            if len(toks) > 1:
                group = seq.group
                group.forked = True
                for j in range(1, len(toks)):
                    # Each child starts from the parent's grammar state before its first token.
                    matcher = seq.matcher.fork() if seq.matcher is not None else None
                    group.seqs[j] = Seq(group, j, seq.state.fork(j), matcher)
                out.forks.append(_Fork(seq, toks[1:], [as_dict(x) for x in lps[1:]] if lps is not None else None))
        return out

    def emit(self, updates: list[RequestUpdate], sampled: Sampled) -> list[SeqDelta]:
        """The deltas of the scheduler's update for these sequences, then the forks of the step's ``n > 1`` rows."""
        seqs, logprobs = self.seqs, sampled.logprobs
        deltas = [
            self._delta(seq, u, logprobs.get(u.req_id)) for u in updates if (seq := seqs.get(u.req_id)) is not None
        ]
        for fork in sampled.forks:
            deltas += self._fork(fork)
        return deltas

    def _delta(self, seq: Seq, update: RequestUpdate, logprobs: list[TokenLogprobDict] | None) -> SeqDelta:
        """Apply one update to its sequence's sampling state; the delta it reports (ending the sequence if it ended)."""
        for t in update.new_token_ids:
            seq.state.append(t)
        delta = SeqDelta(seq.request_id, seq.index, update.new_token_ids, logprobs)
        if seq.first and update.new_token_ids:
            seq.first = False
            delta.num_cached_tokens = update.num_cached_tokens
        if update.finish_reason is not None:
            self._finish(seq, delta, update.finish_reason)
        if seq.matcher is not None and seq.seq_id in self.seqs:
            self._advance_grammar(seq, delta)
        return delta

    def _advance_grammar(self, seq: Seq, delta: SeqDelta) -> None:
        """Accept the sequence's new tokens into its matcher; end it (``stop``) once the grammar has ended."""
        matcher = seq.matcher
        assert matcher is not None
        if not matcher.accept(delta.new_token_ids):
            # The mask forbids this; reaching it means a backend's mask or a sampler let a token through.
            log.error("request %s: token outside its grammar %s; ending it", seq.request_id, delta.new_token_ids)
            self.scheduler.abort([seq.seq_id], status=RequestStatus.FINISHED_ABORTED)
            delta.error = f"structured_outputs.{matcher.field}: a sampled token was outside the grammar"
            self._finish(seq, delta, RequestStatus.FINISHED_ABORTED.value)
        elif matcher.is_terminated():
            self.scheduler.abort([seq.seq_id], status=RequestStatus.FINISHED_STOPPED)
            # Ended by the grammar (nothing may follow), not by a stop token.
            self._finish(seq, delta, RequestStatus.FINISHED_STOPPED.value, stop_token=False)

    def _finish(self, seq: Seq, delta: SeqDelta, reason: str, stop_token: bool = True) -> None:
        """End ``seq`` with ``reason``; a ``stop`` by a stop token reports that token as ``stop_reason``."""
        delta.finish_reason = reason
        toks = delta.new_token_ids
        delta.stop_reason = toks[-1] if reason == "stop" and stop_token and toks else None
        self._seq_done(seq)
        del self.seqs[seq.seq_id]

    def _fork(self, fork: _Fork) -> list[SeqDelta]:
        """Start siblings 1..n-1 from the parent's prompt, sharing its blocks copy-on-write when possible."""
        parent, group = fork.parent, fork.parent.group
        deltas = []
        children = [group.seqs[j] for j in range(1, group.request.params.n)]
        for child, tok, lp in itertools.zip_longest(children, fork.token_ids, fork.logprobs or ()):
            self.seqs[child.seq_id] = child
            if self.scheduler.is_running(parent.seq_id):
                try:
                    update = self.scheduler.fork_sampled(parent.seq_id, child.seq_id, tok)
                except RequestRejectedError:
                    pass
                else:
                    deltas.append(self._delta(child, update, [lp] if lp is not None else None))
                    continue
            # No sharing possible (parent already done, or no room for another row): run the child on
            # its own; its prompt blocks still come from the prefix cache and it samples its own first token.
            self.scheduler.add_request(self._request(child))
        return deltas

    def _seq_done(self, seq: Seq) -> None:
        """Count a finished sequence; the request leaves the core when all ``n`` have finished."""
        group = seq.group
        group.done += 1
        if group.forked and group.done >= group.request.params.n:
            self.groups.pop(group.request.request_id, None)


def as_dict(lp: TokenLogprobs) -> TokenLogprobDict:
    """The sampled token's logprob plus the requested top alternatives, keyed by token id."""
    d = {lp.token_id: lp.logprob}
    for tok, value in lp.top:
        d.setdefault(tok, value)
    return d
