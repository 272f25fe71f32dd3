"""LLMEngine: the step loop joining scheduler, model runner, sampler and detokenizer."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence as Seq
from typing import Any

import torch

from paged_core.engine.build import LoadedModel, build_parts
from paged_core.engine.config import EngineConfig
from paged_core.engine.outputs import RequestOutput
from paged_core.engine.sequence import RequestGroup, Sequence
from paged_core.errors import RequestRejectedError
from paged_core.sampling.isolate import sample_isolated
from paged_core.sampling.logprobs import TokenLogprobs
from paged_core.sampling.params import INT64_MAX, INT64_MIN, SamplingParams
from paged_core.sampling.sampler import Sampler
from paged_core.sched.output import SchedulerOutput
from paged_core.sched.request import Request, RequestStatus

log = logging.getLogger("paged.engine")

_FINISH = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
           RequestStatus.FINISHED_ABORTED: "abort"}  # fmt: skip


class LLMEngine:
    """Continuous batching over a paged KV cache.

    Call :meth:`add_request` any time and :meth:`step` in a loop; each step
    schedules a token budget across requests (chunked prefill, prefix hits
    and decodes alike), runs the model once, samples, and returns the
    outputs of every request that progressed.

    No request can fail another: request data is bounded at admission (see
    :meth:`add_request`), a row the sampler still cannot serve ends alone,
    and a step that fails as a whole ends only the requests it was running.
    :attr:`failed` names the requests the last step ended on an error.
    """

    def __init__(self, config: EngineConfig | None = None, loaded: LoadedModel | None = None) -> None:
        self.config = config or EngineConfig()
        self.parts = build_parts(self.config, loaded)
        self.loaded = self.parts.loaded
        self.scheduler = self.parts.scheduler
        self.runner = self.parts.runner
        self.tokenizer = self.loaded.tokenizer
        self.sampler = Sampler(seed=self.config.seed)
        self.groups: dict[str, RequestGroup] = {}
        self.seqs: dict[str, Sequence] = {}
        self.vocab_size = int(self.loaded.model.config.get_text_config().vocab_size)
        self.failed: dict[str, str] = {}
        """Request id -> why, for the requests the last :meth:`step` ended on an error (reset by each step)."""
        self._ids = itertools.count()
        torch.manual_seed(self.config.seed)

    # ---- requests -----------------------------------------------------
    def tokenize(self, prompt: str | Seq[int], field: str = "prompt") -> list[int]:
        """Token ids of a prompt given as text or as ids; refuses empty and malformed prompts."""
        if isinstance(prompt, str):
            if not prompt:
                raise RequestRejectedError(f"{field} is empty")
            if self.tokenizer is None:
                raise RequestRejectedError(f"{field}: this model has no tokenizer; pass token ids instead of text")
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
        else:
            ids = list(prompt)
            vocab = self.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
            if bad:
                raise RequestRejectedError(f"{field}: token ids must be ints in [0, {vocab}); got {bad[:5]!r}")
        if not ids:
            raise RequestRejectedError(f"{field} is empty")
        return ids

    def add_request(
        self,
        prompt: str | Seq[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a request; returns its id. Raises :class:`RequestRejectedError` naming what is wrong.

        Everything a step will compute with is bounded here, so no request can
        make a step fail: ``params`` are checked against the vocabulary (stop
        token ids inside it; a ``top_k`` above it is clamped to it, which keeps
        the same tokens) and ``priority`` must fit int64.
        """
        params = params or SamplingParams()
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.groups:
            raise RequestRejectedError(f"request id {rid!r} is already in use")
        if not isinstance(priority, int) or isinstance(priority, bool) or not INT64_MIN <= priority <= INT64_MAX:
            shown = priority if isinstance(priority, int) and abs(priority) < 10**40 else type(priority).__name__
            raise RequestRejectedError(f"priority must be an int in [-2**63, 2**63 - 1]; got {shown!r}")
        params = params.for_vocabulary(self.vocab_size)
        ids = self.tokenize(prompt)
        group = RequestGroup(rid, prompt if isinstance(prompt, str) else None, ids, params,
                             self.loaded.eos_token_ids, self.tokenizer, cache_salt, priority)  # fmt: skip
        seq = group.seqs[0]
        self.scheduler.add_request(self._make_request(seq.seq_id, group))
        self.groups[rid] = group
        self.seqs[seq.seq_id] = seq
        return rid

    def _make_request(self, seq_id: str, group: RequestGroup) -> Request:
        """The scheduler's view of one sequence of ``group`` (prompt, limits, stop ids, cache keys)."""
        params = group.params
        eos = self.loaded.eos_token_ids
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids.update(eos[1:])  # the first EOS is the request's own; any others stop too
        return Request(
            seq_id, group.prompt_token_ids, max_tokens=params.max_tokens, min_tokens=params.min_tokens,
            stop_token_ids=stop_ids, eos_token_id=eos[0] if eos else None, ignore_eos=params.ignore_eos,
            priority=group.priority, cache_salt=group.cache_salt,
        )  # fmt: skip

    def abort_request(self, request_ids: Seq[str]) -> None:
        """Abort requests (unknown ids are ignored); their blocks are freed at once."""
        for rid in request_ids:
            group = self.groups.pop(rid, None)
            if group is None:
                continue
            for seq in group.seqs:
                self.scheduler.abort([seq.seq_id])
                self.seqs.pop(seq.seq_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    # ---- one step -----------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; returns the outputs of requests that produced tokens or finished.

        A request whose row the sampler cannot serve ends alone: it comes back
        finished with ``error`` set, and is named in :attr:`failed`, while the
        other rows get their tokens. If the step fails as a whole (the model
        forward, say), the requests it was running are ended, freed and named
        in :attr:`failed`, and the error is raised; the waiting requests and
        the engine are untouched, so the caller may step on.
        """
        self.failed = {}
        out = self.scheduler.schedule()
        # Taken before the step runs: a request that finishes mid-step must still be reported if the step fails.
        seqs = self.seqs
        scheduled = dict.fromkeys(
            seq.group.request_id for sid in out.num_scheduled_tokens if (seq := seqs.get(sid)) is not None
        )
        try:
            return self._run(out)
        except Exception as exc:
            # The caller logs the step's error; the requests only learn that their step failed.
            self._fail(dict.fromkeys(scheduled, f"the engine step running this request failed ({type(exc).__name__})"))
            raise

    def _run(self, out: SchedulerOutput) -> list[RequestOutput]:
        req_ids, logits = self.runner.execute(out)
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[dict[int, float]] | None] = {}
        forks: list[tuple[Sequence, list[int], list[Any]]] = []
        failures: dict[str, str] = {}
        if logits is not None and req_ids:
            seqs = [self.seqs[rid] for rid in req_ids]
            # A request with n > 1 draws all n first tokens from its one shared prefill.
            counts = [1 if s.group.forked else s.group.params.n for s in seqs]
            result, errors = sample_isolated(self.sampler, logits, [s.state for s in seqs], counts)
            for i, exc in errors.items():
                rid = seqs[i].group.request_id
                log.error("request %s: sampling its row failed; ending it alone", rid, exc_info=exc)
                failures[rid] = f"sampling failed for this request ({type(exc).__name__})"
            for seq, toks, lps in zip(seqs, result.token_ids, result.logprobs, strict=True):
                if failures and seq.group.request_id in failures:
                    continue
                sampled[seq.seq_id] = toks[:1]
                logprobs[seq.seq_id] = [_as_dict(lps[0])] if lps is not None else None
                if len(toks) > 1:
                    group = seq.group
                    group.forked = True
                    for j in range(1, len(toks)):
                        group.add_child(j, seq.state.fork(j))
                    forks.append((seq, toks[1:], [_as_dict(x) for x in lps[1:]] if lps is not None else []))
        # Failed requests leave the scheduler first, so the update below skips them.
        ended = self._fail(failures) if failures else []
        touched = self._apply(out, sampled, logprobs)
        for parent, toks, lps in forks:
            touched.update(self._fork(parent, toks, lps))
        return ended + [self._emit(rid) for rid in touched if rid in self.groups]

    def _fail(self, failures: dict[str, str]) -> list[RequestOutput]:
        """End these requests on an error: blocks freed, named in :attr:`failed`, a finished output with ``error``."""
        ended = []
        for rid, message in failures.items():
            self.failed[rid] = message
            group = self.groups.get(rid)
            if group is None:
                continue  # finished earlier in the failed step; its output was lost with the step
            self.abort_request([rid])
            if group.metrics.finished_time is None:
                group.metrics.finished_time = time.monotonic()
            ended.append(
                RequestOutput(rid, group.prompt, group.prompt_token_ids, [], True, group.metrics, error=message)
            )
        return ended

    def _apply(
        self, out: SchedulerOutput, sampled: dict[str, list[int]], logprobs: dict[str, list[dict[int, float]] | None]
    ) -> set[str]:
        # Read prefix hits before the update: a request finishing on its first token leaves the scheduler there.
        hits = {
            rid: max(req.num_cached_tokens, 0)
            for rid in sampled
            if (req := self.scheduler.requests.get(rid)) is not None
            and (seq := self.seqs.get(rid)) is not None
            and seq.group.metrics.first_token_time is None
        }
        updates = self.scheduler.update_from_output(out, sampled)
        touched: set[str] = set()
        now = time.monotonic()
        for u in updates:
            seq = self.seqs.get(u.req_id)
            if seq is None:
                continue
            self.runner.append_tokens(u.req_id, u.new_token_ids)
            group = seq.group
            touched.add(group.request_id)
            if group.metrics.first_token_time is None and u.new_token_ids:
                group.metrics.first_token_time = now
                group.metrics.num_cached_tokens = hits.get(u.req_id, 0)
            matched = seq.accept(u.new_token_ids, logprobs.get(u.req_id))
            if u.finish_reason is not None:
                seq.finish(u.finish_reason, self._stop_reason(u.req_id, u.new_token_ids, u.finish_reason))
                self.seqs.pop(u.req_id, None)
            elif matched is not None:
                self.scheduler.abort([u.req_id], status=RequestStatus.FINISHED_STOPPED)
                seq.finish("stop_string", matched)
                self.seqs.pop(u.req_id, None)
        return touched

    def _stop_reason(self, seq_id: str, toks: list[int], reason: str) -> int | None:
        if reason == "stop" and toks:
            return toks[-1]
        return None

    def _fork(self, parent: Sequence, toks: list[int], lps: list[Any]) -> set[str]:
        """Start siblings 1..n-1 from the parent's prompt, sharing its blocks copy-on-write when possible."""
        group = parent.group
        children = [s for s in group.seqs if s.index > 0]
        for child, tok, lp in itertools.zip_longest(children, toks, lps):
            self.seqs[child.seq_id] = child
            preq = self.scheduler.requests.get(parent.seq_id)
            if preq is not None and preq.status is RequestStatus.RUNNING:
                try:
                    creq = self.scheduler.fork(parent.seq_id, child.seq_id, last_token_id=tok)
                except RequestRejectedError:
                    creq = None
                if creq is not None:
                    self._accept_forked(child, creq, tok, lp)
                    continue
            # No sharing possible (parent already done, or no room for another row): run the child on
            # its own; its prompt blocks still come from the prefix cache and it samples its own first token.
            self.scheduler.add_request(self._make_request(child.seq_id, group))
        return {group.request_id}

    def _accept_forked(self, child: Sequence, creq: Request, tok: int, lp: Any) -> None:
        matched = child.accept([tok], [lp] if lp is not None else None)
        status = creq.check_stop(tok, self.scheduler.max_len)
        if status is not None:
            self.scheduler.abort([child.seq_id], status=status)
            child.finish(_FINISH[status], creq.stop_reason)
            self.seqs.pop(child.seq_id, None)
        elif matched is not None:
            self.scheduler.abort([child.seq_id], status=RequestStatus.FINISHED_STOPPED)
            child.finish("stop_string", matched)
            self.seqs.pop(child.seq_id, None)

    def _emit(self, rid: str) -> RequestOutput:
        group = self.groups[rid]
        output = group.output()
        if output.finished:
            del self.groups[rid]
        return output


def _as_dict(lp: TokenLogprobs) -> dict[int, float]:
    """The sampled token's logprob plus the requested top alternatives, keyed by token id."""
    d = {lp.token_id: lp.logprob}
    for tok, value in lp.top:
        d.setdefault(tok, value)
    return d
