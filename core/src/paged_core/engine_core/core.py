"""EngineCore: scheduler, model runner and sampler; one step in, per-sequence token deltas out.

The core knows token ids only. It never sees text: detokenization, stop strings and assembling
``n`` samples into one output are the front end's (:mod:`paged_core.frontend.output_processor`). The same
object runs in the caller's process (:class:`~paged_core.clients.sync_client.InProcClient`) or in a
child process behind a socket (:mod:`paged_core.engine_core.loop`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from typing import Any

import msgspec
import torch

from paged_core.engine_config import EngineConfig
from paged_core.engine_core.beam import BeamSearch
from paged_core.engine_core.beam_params import check_beam
from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest, SchedulerStats, SeqDelta
from paged_core.errors import DistributedError, RequestRejectedError
from paged_core.loading.build import LoadedModel, build_parts
from paged_core.sampling.isolate import sample_isolated
from paged_core.sampling.logprobs import TokenLogprobs
from paged_core.sampling.params import INT64_MAX, INT64_MIN
from paged_core.sampling.sampler import Sampler, SamplingState
from paged_core.sampling.speculative import verify_isolated
from paged_core.sched.output import SchedulerOutput
from paged_core.sched.request import Request, RequestStatus
from paged_core.speculative import Proposal, SpecStats, speculates

log = logging.getLogger("paged.engine")

_FINISH = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
           RequestStatus.FINISHED_ABORTED: "abort"}  # fmt: skip


class _Group:
    """A request inside the core: its ``n`` sequences and what they share."""

    __slots__ = ("done", "forked", "request", "seqs")

    def __init__(self, request: CoreRequest) -> None:
        self.request = request
        self.seqs: dict[int, _Seq] = {}
        self.forked = request.params.n == 1
        self.done = 0


class _Seq:
    """One sampled sequence, scheduled under ``seq_id``."""

    __slots__ = ("first", "group", "index", "seq_id", "state")

    def __init__(self, group: _Group, index: int, state: SamplingState) -> None:
        rid = group.request.request_id
        self.group = group
        self.index = index
        self.seq_id = rid if group.request.params.n == 1 else f"{rid}#{index}"
        self.state = state
        self.first = True


class EngineCore:
    """Continuous batching over a paged KV cache, in token ids.

    :meth:`add_request` queues a validated :class:`CoreRequest`; each :meth:`step` schedules a token
    budget across requests (chunked prefill, prefix hits and decodes alike), runs the model once,
    samples inside the core and returns a :class:`CoreOutputs` of per-sequence deltas plus the
    scheduler's statistics. No request can fail another: a row the sampler cannot serve ends alone,
    and a step that fails as a whole ends only the requests it was running (``step_error`` says so).
    """

    def __init__(self, config: EngineConfig | None = None, loaded: LoadedModel | None = None) -> None:
        self.config = config or EngineConfig()
        parts = build_parts(self.config, loaded)
        self.loaded = parts.loaded
        self.scheduler = parts.scheduler
        self.runner = parts.runner
        self.tokenizer = self.loaded.tokenizer
        self.sampler = Sampler(seed=self.config.model.seed)
        self.vocab_size = int(self.loaded.model.config.get_text_config().vocab_size)
        self.leader = self.loaded.leader
        """Tensor parallel: the workers this core sends each step's plan to (``None`` on one rank)."""
        self.batch_invariance = parts.batch_invariance
        """The configuration's batch-invariance report (logged at start; in :meth:`facts` and :meth:`stats`)."""
        self.proposer = parts.proposer
        """Speculative decoding: who proposes drafts (``None`` when off)."""
        self.num_spec_tokens = self.config.speculative.num_speculative_tokens
        self.spec_stats = SpecStats()
        self._proposals: dict[str, Proposal] = {}
        self.groups: dict[str, _Group] = {}
        self.seqs: dict[str, _Seq] = {}
        self.beams = BeamSearch(self.scheduler, self.loaded.eos_token_ids, self.vocab_size)
        """Beam-search requests (:mod:`paged_core.engine_core.beam`): their rows bypass the sampler."""
        self.steps = 0
        torch.manual_seed(self.config.model.seed)

    def failure(self) -> str | None:
        """Why this core cannot go on (a tensor-parallel worker died), or ``None``; checked between steps."""
        return self.leader.failure() if self.leader is not None else None

    def close(self) -> None:
        """Release what outlives the object: tensor-parallel workers and the process group (idempotent)."""
        if self.leader is not None:
            self.leader.close()

    # ---- facts and stats ------------------------------------------------
    def facts(self) -> CoreFacts:
        """What a front end needs to know about this core (limits, vocabulary, what runs)."""
        loaded, sched = self.loaded, self.scheduler
        return CoreFacts(
            model_name=loaded.source.name, model_source=str(self.config.model.model or ""), vocab_size=self.vocab_size,
            eos_token_ids=list(loaded.eos_token_ids), max_model_len=int(sched.max_len),
            block_size=int(sched.block_size), num_usable_blocks=int(sched.kv.pool.num_usable_blocks),
            max_num_seqs=int(sched.config.max_num_seqs), backend=loaded.backend.name,
            dtype=str(loaded.dtype).removeprefix("torch."), graph_mode=self.runner.graph_mode,
            model_path=self.runner.forward_impl.name, batch_invariant=self._invariant(),
            batch_variant=self.batch_invariance.reasons() if self.batch_invariance is not None else [],
        )  # fmt: skip

    def _invariant(self) -> bool:
        return self.batch_invariance is not None and self.batch_invariance.invariant

    def stats(self) -> SchedulerStats:
        """The scheduler's and the executor's figures now."""
        sched = self.scheduler
        pool, prefix, executor = sched.kv.pool, sched.kv.stats, self.runner.executor
        return SchedulerStats(
            kv_usage=float(pool.usage), num_free_blocks=int(pool.num_free_blocks),
            num_usable_blocks=int(pool.num_usable_blocks), num_running=int(sched.num_running),
            num_waiting=int(sched.num_waiting), num_preemptions=int(sched.num_preemptions),
            prefix_queries=int(prefix.queries), prefix_hits=int(prefix.hits), steps=self.steps,
            graph_mode=executor.mode, graph_replays=int(executor.stats.replays),
            eager_steps=int(executor.stats.eager_steps), graph_fallbacks=dict(executor.stats.fallback_reasons),
            spec_verify_rows=self.spec_stats.verify_rows, spec_draft_tokens=self.spec_stats.draft_tokens,
            spec_accepted_tokens=self.spec_stats.accepted_tokens, batch_invariant=self._invariant(),
        )  # fmt: skip

    def call(self, method: str) -> Any:
        """A utility call by name (``reset_prefix_cache``, ``stats``, ``facts``); unknown names raise ValueError."""
        if method == "reset_prefix_cache":
            return self.scheduler.reset_prefix_cache()
        if method == "stats":
            return self.stats()
        if method == "facts":
            return self.facts()
        raise ValueError(f"unknown utility call {method!r}; known: facts, reset_prefix_cache, stats")

    # ---- requests -------------------------------------------------------
    def add_request(self, request: CoreRequest) -> None:
        """Queue ``request``, or raise :class:`RequestRejectedError` naming what is wrong.

        The front end validates first; the core checks again what a step computes with (token ids
        inside the vocabulary, params bounded by it, an int64 priority), since in a child process
        its requests come off a socket.
        """
        rid = request.request_id
        if rid in self.groups or rid in self.beams:
            raise RequestRejectedError(f"request id {rid!r} is already in use")
        ids, vocab = request.prompt_token_ids, self.vocab_size
        if not ids:
            raise RequestRejectedError("prompt is empty")
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise RequestRejectedError(f"prompt: token ids must be ints in [0, {vocab}); got {bad[:5]!r}")
        if not INT64_MIN <= request.priority <= INT64_MAX:
            raise RequestRejectedError("priority must be an int in [-2**63, 2**63 - 1]")
        params = request.params.for_vocabulary(vocab)
        if request.beam is not None:
            check_beam(params, request.beam, self.scheduler.config.max_num_seqs)
            self.beams.add(msgspec.structs.replace(request, params=params), request.beam)
            return
        if params is not request.params:
            request = CoreRequest(rid, ids, params, request.cache_salt, request.priority, request.arrival_time)
        group = _Group(request)
        seq = _Seq(group, 0, SamplingState(params, ids, index=0, eos_token_ids=self.loaded.eos_token_ids))
        self.scheduler.add_request(self._make_request(seq))
        group.seqs[0] = seq
        self.groups[rid] = group
        self.seqs[seq.seq_id] = seq

    def _make_request(self, seq: _Seq) -> Request:
        """The scheduler's view of one sequence (prompt, limits, stop ids, cache keys)."""
        req = seq.group.request
        params = req.params
        eos = self.loaded.eos_token_ids
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids.update(eos[1:])  # the first EOS is the request's own; any others stop too
        return Request(
            seq.seq_id, req.prompt_token_ids, max_tokens=params.max_tokens, min_tokens=params.min_tokens,
            stop_token_ids=stop_ids, eos_token_id=eos[0] if eos else None, ignore_eos=params.ignore_eos,
            priority=req.priority, cache_salt=req.cache_salt,
        )  # fmt: skip

    def abort(self, abort: CoreAbort) -> None:
        """End whole requests and single sequences; their blocks are freed at once."""
        status = RequestStatus.FINISHED_STOPPED if abort.stopped else RequestStatus.FINISHED_ABORTED
        for rid in abort.request_ids:
            if self.beams.abort(rid, status):
                continue
            group = self.groups.pop(rid, None)
            if group is not None:
                for seq in group.seqs.values():
                    self.scheduler.abort([seq.seq_id], status=status)
                    self.seqs.pop(seq.seq_id, None)
        for rid, index in abort.sequences:
            owner = self.groups.get(rid)
            one = owner.seqs.get(index) if owner is not None else None
            if one is not None and self.seqs.pop(one.seq_id, None) is not None:
                self.scheduler.abort([one.seq_id], status=status)
                self._seq_done(one)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Shorthand for aborting whole requests."""
        self.abort(CoreAbort(request_ids=list(request_ids)))

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups) or bool(self.beams)

    # ---- one step -------------------------------------------------------
    def step(self) -> CoreOutputs:
        """Schedule, execute, sample and update once; the deltas of every sequence that progressed or ended.

        If the step fails as a whole (the model forward, say), the requests it was running are ended
        and freed, named in ``failed`` with a delta carrying ``error``, and ``step_error`` holds the
        exception's repr; waiting requests and the core are untouched. With tensor parallelism a
        failed step (or a worker found dead before it) raises :class:`DistributedError` with the
        cause instead: the ranks are out of step, so the core must end.
        """
        if self.leader is not None and (dead := self.leader.failure()) is not None:
            raise DistributedError(dead)
        out = self.scheduler.schedule()
        # Taken before the step runs: a request that finishes mid-step must still be reported if the step fails.
        seqs = self.seqs
        scheduled = dict.fromkeys(
            seq.group.request.request_id for sid in out.num_scheduled_tokens if (seq := seqs.get(sid)) is not None
        )
        scheduled.update(dict.fromkeys(self.beams.request_ids(out.num_scheduled_tokens)))
        try:
            deltas, failed = self._run(out)
        except Exception as exc:
            if self.leader is not None:  # the ranks are out of step: no later step can be trusted
                cause = self.leader.explain(exc)
                log.error("engine step failed: %s", cause)
                raise DistributedError(cause) from exc
            log.exception("engine step failed")
            why = f"the engine step running this request failed ({type(exc).__name__})"
            failed = dict.fromkeys(scheduled, why)
            self.steps += 1
            return CoreOutputs(self._fail(failed), self.stats(), failed, step_error=repr(exc))
        self.steps += 1
        return CoreOutputs(deltas, self.stats(), failed)

    def _run(self, out: SchedulerOutput) -> tuple[list[SeqDelta], dict[str, str]]:
        if self.leader is not None:
            self.leader.send(out)
        req_ids, counts, logits = self.runner.execute(out)
        if self.beams and logits is not None and req_ids:  # beam rows go to the search, not the sampler
            req_ids, counts, logits = self.beams.take_rows(req_ids, counts, logits)
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[dict[int, float]]] = {}
        forks: list[tuple[_Seq, list[int], list[dict[int, float]] | None]] = []
        failures: dict[str, str] = {}
        if logits is not None and req_ids:
            if any(c != 1 for c in counts):
                logits, req_ids = self._verify(out, req_ids, counts, logits, sampled, failures)
        if logits is not None and req_ids:
            rows = [self.seqs[rid] for rid in req_ids]
            # A request with n > 1 draws all n first tokens from its one shared prefill.
            counts = [1 if s.group.forked else s.group.request.params.n for s in rows]
            result, errors = sample_isolated(self.sampler, logits, [s.state for s in rows], counts)
            for i, exc in errors.items():
                rid = rows[i].group.request.request_id
                log.error("request %s: sampling its row failed; ending it alone", rid, exc_info=exc)
                failures[rid] = f"sampling failed for this request ({type(exc).__name__})"
            for seq, toks, lps in zip(rows, result.token_ids, result.logprobs, strict=True):
                if failures and seq.group.request.request_id in failures:
                    continue
                sampled[seq.seq_id] = toks[:1]
                if lps is not None:
                    logprobs[seq.seq_id] = [_as_dict(lps[0])]
                if len(toks) > 1:
                    group = seq.group
                    group.forked = True
                    for j in range(1, len(toks)):
                        group.seqs[j] = _Seq(group, j, seq.state.fork(j))
                    forks.append((seq, toks[1:], [_as_dict(x) for x in lps[1:]] if lps is not None else None))
        # Failed requests leave the scheduler first, so the update below skips them.
        deltas = self._fail(failures) if failures else []
        deltas += self._apply(out, sampled, logprobs)
        for parent, rest, rest_lps in forks:
            deltas += self._fork(parent, rest, rest_lps)
        if self.beams:  # after the scheduler's update: beams extend, fork and drop here
            beam_deltas, beam_failures = self.beams.advance()
            deltas += self._fail(beam_failures) + beam_deltas
            failures.update(beam_failures)
        if self.proposer is not None:
            self._propose()
        return deltas, failures

    def _verify(
        self, out: SchedulerOutput, req_ids: list[str], counts: list[int], logits: torch.Tensor,
        sampled: dict[str, list[int]], failures: dict[str, str],
    ) -> tuple[torch.Tensor | None, list[str]]:  # fmt: skip
        """Verify the rows that ran drafts (their tokens into ``sampled``); the plain rows' logits and ids."""
        plain_rows: list[int] = []
        plain_ids: list[str] = []
        spec_rows: list[int] = []
        spec_seqs: list[_Seq] = []
        drafts: list[list[int]] = []
        start = 0
        for rid, c in zip(req_ids, counts, strict=True):
            if c == 1:
                plain_rows.append(start)
                plain_ids.append(rid)
            else:
                spec_rows.extend(range(start, start + c))
                spec_seqs.append(self.seqs[rid])
                drafts.append(list(out.scheduled_spec_decode_tokens[rid]))
            start += c
        proposals = self._proposals
        probs = [p.probs[: len(d)] if (p := proposals.pop(s.seq_id, None)) is not None and p.probs is not None
                 else None for s, d in zip(spec_seqs, drafts, strict=True)]  # fmt: skip
        index = torch.tensor(spec_rows, device=logits.device)
        kept, errors = verify_isolated(self.sampler, logits.index_select(0, index), [s.state for s in spec_seqs],
                                       drafts, probs if any(p is not None for p in probs) else None)  # fmt: skip
        for i, (seq, toks) in enumerate(zip(spec_seqs, kept, strict=True)):
            rid = seq.group.request.request_id
            if i in errors:
                log.error("request %s: verifying its drafts failed; ending it alone", rid, exc_info=errors[i])
                failures[rid] = f"sampling failed for this request ({type(errors[i]).__name__})"
                continue
            sampled[seq.seq_id] = toks
            self.spec_stats.record(len(drafts[i]), len(toks) - 1)
        if not plain_rows:
            return None, []
        return logits.index_select(0, torch.tensor(plain_rows, device=logits.device)), plain_ids

    def _propose(self) -> None:
        """Drafts for the next step, for every running sequence that is about to decode and may speculate."""
        assert self.proposer is not None
        sched, seqs, k = self.scheduler, self.seqs, self.num_spec_tokens
        asking: list[Request] = []
        ks: list[int] = []
        states: list[SamplingState] = []
        for req in sched.running:
            seq = seqs.get(req.request_id)
            # Only a sequence whose last token is its one uncomputed token decodes next step.
            if seq is None or req.num_computed_tokens != req.num_tokens - 1:
                continue
            if not speculates(seq.state, seq.group.request.params.speculate):
                continue
            # Drafts past max_tokens would be dropped by the stop check: do not propose them.
            room = min(k, req.max_tokens - (req.num_tokens - req.num_prompt_tokens) - 1)
            if room >= 1:
                asking.append(req)
                ks.append(room)
                states.append(seq.state)
        self._proposals.clear()
        if not asking:
            return
        for req, proposal in zip(asking, self.proposer.propose(asking, ks, states), strict=True):
            if proposal is not None and proposal.tokens:
                req.spec_token_ids = proposal.tokens
                self._proposals[req.request_id] = proposal

    def _fail(self, failures: dict[str, str]) -> list[SeqDelta]:
        """End these requests on an error: blocks freed, one delta each carrying ``error``."""
        deltas = []
        for rid, message in failures.items():
            if rid in self.groups or rid in self.beams:
                self.abort_requests([rid])
            deltas.append(SeqDelta(rid, 0, [], finish_reason="abort", error=message))
        return deltas

    def _apply(
        self, out: SchedulerOutput, sampled: dict[str, list[int]], logprobs: dict[str, list[dict[int, float]]]
    ) -> list[SeqDelta]:
        requests, seqs = self.scheduler.requests, self.seqs
        # Read prefix hits before the update: a request finishing on its first token leaves the scheduler there.
        hits = {
            rid: max(req.num_cached_tokens, 0)
            for rid in sampled
            if (seq := seqs.get(rid)) is not None and seq.first and (req := requests.get(rid)) is not None
        }
        deltas = []
        for u in self.scheduler.update_from_output(out, sampled):
            seq = seqs.get(u.req_id)
            if seq is None:
                continue
            for t in u.new_token_ids:
                seq.state.append(t)
            delta = SeqDelta(seq.group.request.request_id, seq.index, u.new_token_ids, logprobs.get(u.req_id))
            if seq.first and u.new_token_ids:
                seq.first = False
                delta.num_cached_tokens = hits.get(u.req_id, 0)
            if u.finish_reason is not None:
                delta.finish_reason = u.finish_reason
                delta.stop_reason = u.new_token_ids[-1] if u.finish_reason == "stop" and u.new_token_ids else None
                self._seq_done(seq)
                del seqs[u.req_id]
            deltas.append(delta)
        return deltas

    def _fork(self, parent: _Seq, toks: list[int], lps: list[dict[int, float]] | None) -> list[SeqDelta]:
        """Start siblings 1..n-1 from the parent's prompt, sharing its blocks copy-on-write when possible."""
        group = parent.group
        deltas = []
        children = [group.seqs[j] for j in range(1, group.request.params.n)]
        for child, tok, lp in itertools.zip_longest(children, toks, lps or ()):
            self.seqs[child.seq_id] = child
            preq = self.scheduler.requests.get(parent.seq_id)
            if preq is not None and preq.status is RequestStatus.RUNNING:
                try:
                    creq = self.scheduler.fork(parent.seq_id, child.seq_id, last_token_id=tok)
                except RequestRejectedError:
                    creq = None
                if creq is not None:
                    deltas.append(self._accept_forked(child, creq, tok, lp))
                    continue
            # No sharing possible (parent already done, or no room for another row): run the child on
            # its own; its prompt blocks still come from the prefix cache and it samples its own first token.
            self.scheduler.add_request(self._make_request(child))
        return deltas

    def _accept_forked(self, child: _Seq, creq: Request, tok: int, lp: dict[int, float] | None) -> SeqDelta:
        child.state.append(tok)
        child.first = False
        parent_cached = max(creq.num_cached_tokens, 0)
        delta = SeqDelta(child.group.request.request_id, child.index, [tok], [lp] if lp is not None else None,
                         num_cached_tokens=parent_cached)  # fmt: skip
        status = creq.check_stop(tok, self.scheduler.max_len)
        if status is not None:
            self.scheduler.abort([child.seq_id], status=status)
            delta.finish_reason = _FINISH[status]
            delta.stop_reason = creq.stop_reason if isinstance(creq.stop_reason, int) else None
            self._seq_done(child)
            del self.seqs[child.seq_id]
        return delta

    def _seq_done(self, seq: _Seq) -> None:
        """Count a finished sequence; the request leaves the core when all ``n`` have finished."""
        group = seq.group
        group.done += 1
        if group.forked and group.done >= group.request.params.n:
            self.groups.pop(group.request.request_id, None)


def _as_dict(lp: TokenLogprobs) -> dict[int, float]:
    """The sampled token's logprob plus the requested top alternatives, keyed by token id."""
    d = {lp.token_id: lp.logprob}
    for tok, value in lp.top:
        d.setdefault(tok, value)
    return d
