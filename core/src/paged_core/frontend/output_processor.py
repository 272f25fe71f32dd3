"""OutputProcessor: the core's token deltas to cumulative :class:`RequestOutput`\\ s.

It owns what the core never sees: incremental detokenization, stop strings (a match finishes the
sequence here, never showing text past the stop, and asks the caller to abort it in the core),
assembling a request's ``n`` samples, logprobs and the request's timing metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from paged_core.engine_core.messages import CoreOutputs, CoreRequest, SeqDelta
from paged_core.frontend.outputs import CompletionOutput, RequestMetrics, RequestOutput
from paged_core.text.detokenizer import IncrementalDetokenizer
from paged_core.text.stop import StopStringChecker


class _Sequence:
    """One of a request's ``n`` samples: its text, stop-string matcher and cumulative output."""

    __slots__ = ("detok", "out", "stops")

    def __init__(self, request: CoreRequest, index: int, tokenizer: Any | None) -> None:
        params = request.params
        self.detok = (
            IncrementalDetokenizer(tokenizer, request.prompt_token_ids, params.skip_special_tokens)
            if tokenizer is not None
            else None
        )
        self.stops = StopStringChecker(params.stop_strings, params.include_stop_str_in_output) if params.stop else None
        self.out = CompletionOutput(index=index, logprobs=[] if params.logprobs is not None else None)

    def accept(self, token_ids: list[int], logprobs: list[dict[int, float]] | None) -> str | None:
        """Record new tokens; returns the stop string if one now ends the text."""
        out = self.out
        out.token_ids.extend(token_ids)
        out.new_token_ids.extend(token_ids)
        if out.logprobs is not None and logprobs is not None:
            out.logprobs.extend(logprobs)
        if self.detok is None:
            return None
        delta = self.detok.push(token_ids)
        if self.stops is None:
            out.text += delta
            out.new_text += delta
            return None
        emit, matched = self.stops.feed(delta)
        out.text += emit
        out.new_text += emit
        return matched

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark finished; releases any text held back for stop-string matching."""
        if self.out.finish_reason is not None:
            return
        if reason != "stop_string":
            # Release what was held back: bytes of an unfinished character, then stop-string look-ahead.
            tail = self.detok.flush() if self.detok is not None else ""
            if self.stops is not None:
                emit, matched = self.stops.feed(tail)
                tail = emit + ("" if matched else self.stops.flush())
            self.out.text += tail
            self.out.new_text += tail
        self.out.finish_reason = "stop" if reason == "stop_string" else reason
        self.out.stop_reason = stop_reason


class _Request:
    """A user request in the front end: prompt, ``n`` sequences, metrics."""

    __slots__ = ("metrics", "prompt", "request", "seqs")

    def __init__(self, request: CoreRequest, prompt: str | None, tokenizer: Any | None) -> None:
        self.request = request
        self.prompt = prompt
        self.seqs = [_Sequence(request, i, tokenizer) for i in range(request.params.n)]
        self.metrics = RequestMetrics(
            arrival_time=request.arrival_time, num_prompt_tokens=len(request.prompt_token_ids)
        )

    @property
    def finished(self) -> bool:
        return all(s.out.finish_reason is not None for s in self.seqs)

    def snapshot(self) -> RequestOutput:
        """The cumulative output now; clears the per-step deltas."""
        outs = []
        for seq in self.seqs:
            o = seq.out
            outs.append(
                CompletionOutput(
                    index=o.index,
                    text=o.text,
                    token_ids=list(o.token_ids),
                    finish_reason=o.finish_reason,
                    stop_reason=o.stop_reason,
                    logprobs=list(o.logprobs) if o.logprobs is not None else None,
                    new_text=o.new_text,
                    new_token_ids=o.new_token_ids,
                    cumulative_logprob=o.cumulative_logprob,
                    score=o.score,
                )
            )
            o.new_text = ""
            o.new_token_ids = []
        self.metrics.num_generated_tokens = sum(len(s.out.token_ids) for s in self.seqs)
        finished = self.finished
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.monotonic()
        req = self.request
        return RequestOutput(req.request_id, self.prompt, req.prompt_token_ids, outs, finished, self.metrics)


class OutputProcessor:
    """Turns :class:`CoreOutputs` into :class:`RequestOutput`\\ s, one per request that changed."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, _Request] = {}

    def add(self, request: CoreRequest, prompt: str | None = None) -> None:
        """Start tracking ``request`` (``prompt`` is its text, when it came as text)."""
        self.requests[request.request_id] = _Request(request, prompt, self.tokenizer)

    def remove(self, request_ids: Iterable[str]) -> None:
        """Forget requests (aborted by the caller); later deltas for them are dropped."""
        for rid in request_ids:
            self.requests.pop(rid, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.requests

    def __len__(self) -> int:
        return len(self.requests)

    def process(self, outputs: CoreOutputs) -> tuple[list[RequestOutput], list[tuple[str, int]]]:
        """The outputs of requests that changed, and the sequences a stop string ended (to abort in the core)."""
        now = time.monotonic()
        touched: dict[str, _Request] = {}
        failed: list[RequestOutput] = []
        stopped: list[tuple[str, int]] = []
        for delta in outputs.deltas:
            req = self.requests.get(delta.request_id)
            if req is None:
                continue  # aborted here while the core ran the step
            if delta.error is not None:
                failed.append(self._fail(req, delta.error, now))
                touched.pop(delta.request_id, None)
                continue
            seq = req.seqs[delta.index]
            if seq.out.finish_reason is not None:
                continue  # ended here by a stop string; the core had not heard yet
            self._accept(req, seq, delta, now, stopped)
            touched[delta.request_id] = req
        results = failed + [req.snapshot() for req in touched.values()]
        for out in results:
            if out.finished:
                self.requests.pop(out.request_id, None)
        return results, stopped

    def _accept(
        self, req: _Request, seq: _Sequence, delta: SeqDelta, now: float, stopped: list[tuple[str, int]]
    ) -> None:
        metrics = req.metrics
        if metrics.first_token_time is None and delta.new_token_ids:
            metrics.first_token_time = now
        if delta.num_cached_tokens >= 0 and delta.index == 0:
            metrics.num_cached_tokens = delta.num_cached_tokens
        if delta.beam is not None:  # a beam-search sequence: whole, once, with its scores
            beam = delta.beam
            seq.out.cumulative_logprob, seq.out.score = beam.cumulative_logprob, beam.score
            metrics.peak_blocks, metrics.peak_blocks_unshared = beam.peak_blocks, beam.peak_blocks_unshared
            metrics.num_forks = beam.forks
        matched = seq.accept(delta.new_token_ids, delta.new_logprobs)
        if delta.finish_reason is not None:
            seq.finish(delta.finish_reason, delta.stop_reason)
        elif matched is not None:
            seq.finish("stop_string", matched)
            stopped.append((delta.request_id, delta.index))

    def _fail(self, req: _Request, error: str, now: float) -> RequestOutput:
        self.requests.pop(req.request.request_id, None)
        if req.metrics.finished_time is None:
            req.metrics.finished_time = now
        r = req.request
        return RequestOutput(r.request_id, req.prompt, r.prompt_token_ids, [], True, req.metrics, error=error)
