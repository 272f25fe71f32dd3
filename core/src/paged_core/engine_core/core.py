"""EngineCore: scheduler, model runner and sampler; one step in, per-sequence token deltas out.

The core knows token ids only. It never sees text: detokenization, stop strings and assembling
``n`` samples into one output are the front end's (:mod:`paged_core.frontend.output_processor`). The same
object runs in the caller's process (:class:`~paged_core.clients.in_process.InProcClient`) or in a
child process behind a socket (:mod:`paged_core.engine_core.loop`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from paged_core.engine_config import EngineConfig
from paged_core.engine_core.beam import BeamSearch
from paged_core.engine_core.drafts import Drafts
from paged_core.engine_core.grammars import Grammars
from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest, SchedulerStats, SeqDelta
from paged_core.engine_core.overlap import (
    InFlight,
    OverlapStats,
    StepWorker,
    async_scheduling,
    fill_placeholders,
    overlap_blocker,
)
from paged_core.engine_core.rows import Rows
from paged_core.engine_core.sampled import Sampled, SampledGroups
from paged_core.errors import DistributedError, RequestRejectedError
from paged_core.loading.build import LoadedModel, build_parts
from paged_core.loading.kv_dtype import kv_dtype_name, resolve_kv_dtype
from paged_core.lora import LoRAError, LoRARequest
from paged_core.sampling.sampler import Sampler
from paged_core.sched.output import SchedulerOutput
from paged_core.sched.request import RequestStatus
from paged_core.speculative import SpecStats
from paged_core.structured import GrammarCompiler

log = logging.getLogger("paged.engine")


class EngineCore:
    """Continuous batching over a paged KV cache, in token ids.

    :meth:`add_request` queues a validated :class:`CoreRequest`; each :meth:`step` schedules a token
    budget across requests (chunked prefill, prefix hits and decodes alike), runs the model once,
    hands each logits row to its consumer (:class:`SampledGroups`, :class:`Drafts` verification or
    :class:`BeamSearch`), applies the tokens in one scheduler update and returns a :class:`CoreOutputs`
    of per-sequence deltas plus the scheduler's statistics. Every write to a scheduler request is a
    scheduler call. No request can fail another: a row the sampler cannot serve ends alone, and a
    step that fails as a whole ends only the requests it was running (``step_error`` says so).
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
        self.grammars = Grammars(self._grammar_compiler, self.loaded.backend.fused_ops().apply_token_bitmask)
        """Structured outputs (:mod:`paged_core.engine_core.grammars`): compiles in flight, each step's masks."""
        self.sampled = SampledGroups(self.scheduler, self.sampler, self.loaded.eos_token_ids, self.grammars)
        """Sampled requests (:mod:`paged_core.engine_core.sampled`): ``n`` sequences each, their rows to the sampler."""
        num_drafts = self.config.speculative.num_speculative_tokens
        self.drafts = Drafts(self.scheduler, self.sampler, parts.proposer, num_drafts, self.grammars)
        """Speculative decoding (:mod:`paged_core.engine_core.drafts`): drafts proposed, then verified."""
        self.beams = BeamSearch(self.scheduler, self.loaded.eos_token_ids, self.vocab_size)
        """Beam-search requests (:mod:`paged_core.engine_core.beam`): their rows bypass the sampler."""
        self.steps = 0
        torch.manual_seed(self.config.model.seed)
        why_not = async_scheduling(
            self.config.scheduler.async_scheduling,
            self.loaded.backend.device.type,
            speculative=parts.proposer is not None,
            tensor_parallel=self.leader is not None,
        )
        self.async_scheduling = why_not is None
        """Whether step N+1 is planned while step N runs (:mod:`paged_core.engine_core.overlap`)."""
        log.info("asynchronous scheduling: %s", "on" if why_not is None else f"off: {why_not}")
        self._worker = StepWorker(self._execute) if why_not is None else None
        self.overlap = OverlapStats()
        """How many steps were finished with the next one already running, and why the others ran in turn."""
        self._in_flight: InFlight | None = None

    def _grammar_compiler(self) -> GrammarCompiler:
        """The compiler for this model's tokenizer and logits width (built on the first constrained request)."""
        if self.tokenizer is None:
            raise RequestRejectedError("structured_outputs: this model has no tokenizer to compile grammars for")
        return GrammarCompiler(self.tokenizer, max(self.vocab_size, len(self.tokenizer)))

    def failure(self) -> str | None:
        """Why this core cannot go on (a tensor-parallel worker died), or ``None``; checked between steps."""
        return self.leader.failure() if self.leader is not None else None

    def close(self) -> None:
        """Release what outlives the object: tensor-parallel workers and the process group (idempotent)."""
        if self._worker is not None:
            self._worker.close()
        if self.leader is not None:
            self.leader.close()
        self.grammars.close()

    # ---- facts and stats ------------------------------------------------
    def facts(self) -> CoreFacts:
        """What a front end needs to know about this core (limits, vocabulary, what runs)."""
        loaded, sched = self.loaded, self.scheduler
        return CoreFacts(
            model_name=loaded.source.name,
            model_source=str(self.config.model.model or ""),
            vocab_size=self.vocab_size,
            eos_token_ids=list(loaded.eos_token_ids),
            max_model_len=int(sched.max_len),
            block_size=int(sched.block_size),
            num_usable_blocks=int(sched.kv.pool.num_usable_blocks),
            max_num_seqs=int(sched.config.max_num_seqs),
            backend=loaded.backend.name,
            dtype=str(loaded.dtype).removeprefix("torch."),
            graph_mode=self.runner.graph_mode,
            model_path=self.runner.forward_impl.name,
            batch_invariant=self._invariant(),
            batch_variant=self.batch_invariance.reasons() if self.batch_invariance is not None else [],
            kv_cache_dtype=kv_dtype_name(resolve_kv_dtype(self.config.cache.kv_cache_dtype, loaded.dtype)),
        )

    @property
    def spec_stats(self) -> SpecStats:
        """Speculative decoding's figures so far: rows verified, drafts proposed and accepted."""
        return self.drafts.stats

    def _invariant(self) -> bool:
        return self.batch_invariance is not None and self.batch_invariance.invariant

    def stats(self) -> SchedulerStats:
        """The scheduler's and the executor's figures now."""
        sched = self.scheduler
        pool, prefix, executor = sched.kv.pool, sched.kv.stats, self.runner.executor
        return SchedulerStats(
            kv_usage=float(pool.usage),
            num_free_blocks=int(pool.num_free_blocks),
            num_usable_blocks=int(pool.num_usable_blocks),
            num_running=int(sched.num_running),
            num_waiting=int(sched.num_waiting),
            num_preemptions=int(sched.num_preemptions),
            prefix_queries=int(prefix.queries),
            prefix_hits=int(prefix.hits),
            steps=self.steps,
            graph_mode=executor.mode,
            graph_replays=int(executor.stats.replays),
            graph_piece_replays=int(executor.stats.piece_replays),
            eager_steps=int(executor.stats.eager_steps),
            graph_fallbacks=dict(executor.stats.fallback_reasons),
            spec_verify_rows=self.spec_stats.verify_rows,
            spec_draft_tokens=self.spec_stats.draft_tokens,
            spec_accepted_tokens=self.spec_stats.accepted_tokens,
            batch_invariant=self._invariant(),
            grammar=self.grammars.stats.snapshot(),
        )

    def call(self, method: str, *args: Any) -> Any:
        """A utility call by name (``reset_prefix_cache``, ``stats``, ``facts``, ``load_lora``, ``remove_lora``);
        unknown names raise ValueError.

        ``load_lora(name, id, path)`` loads and checks an adapter now (a server's runtime load): None, or the
        problem's text (the adapter is then not registered). ``remove_lora(id)`` forgets one (True if it was
        registered); the caller makes sure no request still runs on it.
        """
        if method == "reset_prefix_cache":
            return self.scheduler.reset_prefix_cache()
        if method == "stats":
            return self.stats()
        if method == "facts":
            return self.facts()
        if method == "load_lora":
            return self._load_lora(LoRARequest(*args))
        if method == "remove_lora":
            (lora_id,) = args
            return self.runner.lora is not None and self.runner.lora.remove(int(lora_id))
        raise ValueError(
            f"unknown utility call {method!r}; known: facts, load_lora, remove_lora, reset_prefix_cache, stats"
        )

    def _load_lora(self, lora: LoRARequest) -> str | None:
        slots = self.runner.lora
        if slots is None:
            return f"LoRA adapter {lora.name!r}: the engine runs without enable_lora"
        try:
            slots.register(lora)
        except LoRAError as exc:
            return str(exc)
        return None

    # ---- requests -------------------------------------------------------
    def add_request(self, request: CoreRequest) -> None:
        """Queue ``request``, or raise :class:`RequestRejectedError` if it is a duplicate or can never run here.

        The request is trusted as validated: by the front end in this process, or, off a socket, by
        :func:`~paged_core.engine_core.wire_checks.check_wire_request` in the core's loop.
        """
        rid = request.request_id
        if rid in self.sampled or rid in self.beams:
            raise RequestRejectedError(f"request id {rid!r} is already in use")
        if request.lora is not None:
            self._register_lora(request)
        if request.beam is not None:
            self.beams.add(request, request.beam)
            return
        self.sampled.add(request)

    def _register_lora(self, request: CoreRequest) -> None:
        """Load (once) and check the request's adapter, so a bad one is refused at once, naming it."""
        lora = request.lora
        assert lora is not None
        slots = self.runner.lora
        if slots is None:
            raise RequestRejectedError(f"LoRA adapter {lora.name!r} requested, but the engine runs without enable_lora")
        if request.beam is not None:
            raise RequestRejectedError("beam search with a LoRA adapter is not supported yet")
        try:
            slots.register(lora)
        except LoRAError as exc:
            raise RequestRejectedError(str(exc)) from None

    def abort(self, abort: CoreAbort) -> None:
        """End whole requests and single sequences; their blocks are freed at once."""
        status = RequestStatus.FINISHED_STOPPED if abort.stopped else RequestStatus.FINISHED_ABORTED
        for rid in abort.request_ids:
            if not self.beams.abort(rid, status):
                self.sampled.abort(rid, status)
        for rid, index in abort.sequences:
            self.sampled.abort_sequence(rid, index, status)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Shorthand for aborting whole requests."""
        self.abort(CoreAbort(request_ids=list(request_ids)))

    def has_unfinished_requests(self) -> bool:
        return bool(self.sampled) or bool(self.beams)

    # ---- one step -------------------------------------------------------
    def step(self) -> CoreOutputs:
        """Schedule, execute, hand the rows to their consumers, update once: the deltas of every sequence
        that progressed or ended.

        If the step fails as a whole (the model forward, say), the requests it was running are ended
        and freed, named in ``failed`` with a delta carrying ``error``, and ``step_error`` holds the
        exception's repr; waiting requests and the core are untouched. With tensor parallelism a
        failed step (or a worker found dead before it) raises :class:`DistributedError` with the
        cause instead: the ranks are out of step, so the core must end.

        With asynchronous scheduling (:mod:`paged_core.engine_core.overlap`) the step returned is the
        one started by the previous call, and the next one is already running when this returns.
        """
        if self.leader is not None and (dead := self.leader.failure()) is not None:
            raise DistributedError(dead)
        # Requests whose grammar compiled join the scheduler now; a failed compile ends its request alone.
        if self.grammars.pending and not self.scheduler.requests:
            self.grammars.wait(_IDLE_WAIT_S)  # nothing else to run: wait for a compile instead of spinning
        compiled_failures = self.sampled.admit_compiled()
        early = self._fail(compiled_failures)
        if self._in_flight is not None:
            return self._step_overlapped(self._in_flight, early, compiled_failures)
        out = self.scheduler.schedule()
        if self._worker is not None:
            if (blocker := self._overlap_blocker(out)) is None:
                return self._step_overlapped(self._launch(out), early, compiled_failures)
            self.overlap.count(blocker)  # this step runs in turn
        # Taken before the step runs: a request that finishes mid-step must still be reported if the step fails.
        running = self._request_ids(out.num_scheduled_tokens)
        try:
            deltas, failed = self._run(out)
        except Exception as exc:
            failed_out = self._step_failed(exc, running)
            failed_out.deltas[:0] = early
            failed_out.failed.update(compiled_failures)
            return failed_out
        self.steps += 1
        return CoreOutputs(early + deltas, self.stats(), compiled_failures | failed)

    def _run(self, out: SchedulerOutput) -> tuple[list[SeqDelta], dict[str, str]]:
        """Execute ``out``, hand each consumer its rows, apply their tokens in one scheduler update."""
        beam_rows, rows = self._execute(out).split(self.beams.owns)
        draft_rows, plain_rows = rows.split(_has_drafts)
        self.beams.take(beam_rows)
        verified = self.drafts.verify(draft_rows, out, self.sampled.seqs)
        sampled = self.sampled.sample(plain_rows)
        # Failed requests leave the scheduler first, so the update skips them.
        failures = verified.failures | sampled.failures
        deltas = self._fail(failures)
        updates = self.scheduler.update_from_output(out, verified.token_ids | sampled.token_ids)
        deltas += self.sampled.emit(updates, sampled)
        beam_deltas, beam_failures = self.beams.advance()  # after the update: beams extend, fork and drop
        deltas += self._fail(beam_failures) + beam_deltas
        self.drafts.propose(self.sampled.seqs)  # for the next step
        return deltas, failures | beam_failures

    # ---- asynchronous scheduling (see paged_core.engine_core.overlap) ----------------
    def _step_overlapped(self, step: InFlight, early: list[SeqDelta], compiled_failures: dict[str, str]) -> CoreOutputs:
        """Finish ``step`` (in flight), having planned and started the next one first when nothing forbids it."""
        self._in_flight = None
        blocker = self._overlap_blocker(step.out)
        self.overlap.count(blocker)
        nxt = self.scheduler.schedule(overlap=True) if blocker is None else None
        try:
            sampled = self._sample(step)
            if nxt is not None:
                self._in_flight, nxt = self._launch(fill_placeholders(nxt, sampled.token_ids)), None
                in_flight: SchedulerOutput | None = self._in_flight.out
            else:
                in_flight = None
            deltas = self._fail(sampled.failures)
            updates = self.scheduler.update_from_output(step.out, sampled.token_ids, in_flight=in_flight)
            deltas += self.sampled.emit(updates, sampled)
        except Exception as exc:
            if nxt is not None:  # planned but not started: it runs, the rows of the failed step's requests dropped
                self._in_flight = self._launch(fill_placeholders(nxt, {}))
            running = self._request_ids(rid for rid, seq in step.seqs.items() if self.sampled.seqs.get(rid) is seq)
            failed_out = self._step_failed(exc, running)
            failed_out.deltas[:0] = early
            failed_out.failed.update(compiled_failures)
            return failed_out
        self.steps += 1
        return CoreOutputs(early + deltas, self.stats(), compiled_failures | sampled.failures)

    def _sample(self, step: InFlight) -> Sampled:
        """Wait for ``step``'s rows and sample those of sequences still live."""
        rows = step.rows.result()
        # Rows of sequences that ended (or were aborted) after this step was planned are dropped, also when a
        # new request has taken the id since.
        live, planned = self.sampled.seqs, step.seqs
        return self.sampled.sample(rows.split(lambda rid, _count: live.get(rid, _GONE) is planned.get(rid))[0])

    def _launch(self, out: SchedulerOutput) -> InFlight:
        """Start ``out``'s forward on the step worker (after any forward already started)."""
        assert self._worker is not None
        seqs = self.sampled.seqs
        planned = {rid: seq for rid in out.num_scheduled_tokens if (seq := seqs.get(rid)) is not None}
        return InFlight(out, self._worker.submit(out), planned)

    def _overlap_blocker(self, out: SchedulerOutput) -> str | None:
        """Why the step after ``out`` must wait until ``out`` is applied (``None``: it may be planned now)."""
        seqs = self.sampled.seqs
        return overlap_blocker(
            out, bool(self.beams), lambda rid: (seq := seqs.get(rid)) is not None and not seq.group.forked
        )

    def _execute(self, out: SchedulerOutput) -> Rows:
        """One model forward over the plan (sent to the tensor-parallel workers first): the rows it produced."""
        if self.leader is not None:
            self.leader.send(out)
        return Rows(*self.runner.execute(out))

    def _request_ids(self, seq_ids: Iterable[str]) -> list[str]:
        """The requests (sampled or beam search) owning these scheduler ids, each once."""
        ids = list(seq_ids)
        return list(dict.fromkeys(self.sampled.request_ids(ids) + self.beams.request_ids(ids)))

    def _step_failed(self, exc: Exception, running: list[str]) -> CoreOutputs:
        """End the requests a failed step was running; what the step reports instead of its deltas."""
        if self.leader is not None:  # the ranks are out of step: no later step can be trusted
            cause = self.leader.explain(exc)
            log.error("engine step failed: %s", cause)
            raise DistributedError(cause) from exc
        log.exception("engine step failed")
        why = f"the engine step running this request failed ({type(exc).__name__})"
        failed = dict.fromkeys(running, why)
        self.steps += 1
        return CoreOutputs(self._fail(failed), self.stats(), failed, step_error=repr(exc))

    def _fail(self, failures: dict[str, str]) -> list[SeqDelta]:
        """End these requests on an error: blocks freed, one delta each carrying ``error``."""
        deltas = []
        for rid, message in failures.items():
            if rid in self.sampled or rid in self.beams:
                self.abort_requests([rid])
            deltas.append(SeqDelta(rid, 0, [], finish_reason="abort", error=message))
        return deltas


_GONE = object()
"""Stands for a sequence no longer in the core (never one a plan holds)."""

_IDLE_WAIT_S = 0.05
"""How long an idle step waits for a grammar compile (the loop then steps again, so new requests are seen)."""


def _has_drafts(seq_id: str, count: int) -> bool:
    """A row that ran drafts after its last token has ``1 + drafts`` logits rows (verification's)."""
    return count > 1
