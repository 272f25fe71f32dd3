"""Per-sequence and per-request bookkeeping on the engine side: text, stop strings, logprobs, metrics."""

from __future__ import annotations

import time
from typing import Any

from paged_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from paged_core.sampling.params import SamplingParams
from paged_core.sampling.sampler import SamplingState
from paged_core.text.detokenizer import IncrementalDetokenizer
from paged_core.text.stop import StopStringChecker


class Sequence:
    """One generated sequence (index ``index`` of its request's ``n``), scheduled as ``seq_id``."""

    def __init__(
        self, group: RequestGroup, index: int, tokenizer: Any | None, state: SamplingState | None = None
    ) -> None:
        params = group.params
        self.group = group
        self.index = index
        self.seq_id = group.request_id if group.params.n == 1 else f"{group.request_id}#{index}"
        self.state = state or SamplingState(
            params, group.prompt_token_ids, index=index, eos_token_ids=group.eos_token_ids
        )
        self.detok = (
            IncrementalDetokenizer(tokenizer, group.prompt_token_ids, params.skip_special_tokens)
            if tokenizer is not None
            else None
        )
        self.stops = StopStringChecker(params.stop_strings, params.include_stop_str_in_output) if params.stop else None
        self.out = CompletionOutput(index=index, logprobs=[] if params.logprobs is not None else None)

    def accept(self, token_ids: list[int], logprobs: list[dict[int, float]] | None) -> str | None:
        """Record tokens the scheduler accepted; returns the stop string if one now ends the text."""
        out = self.out
        out.token_ids.extend(token_ids)
        out.new_token_ids.extend(token_ids)
        for t in token_ids:
            self.state.append(t)
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


class RequestGroup:
    """A user request: one prompt, ``n`` sequences, the metrics and the output assembled each step."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        tokenizer: Any | None,
        cache_salt: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.cache_salt = cache_salt
        self.priority = priority
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.metrics = RequestMetrics(
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            num_prompt_tokens=len(prompt_token_ids),
        )
        self.seqs: list[Sequence] = [Sequence(self, 0, tokenizer)]
        self.tokenizer = tokenizer
        self.forked = params.n == 1

    def add_child(self, index: int, state: SamplingState) -> Sequence:
        """The sequence for sample ``index`` of ``n``, continuing the sampling stream ``state``."""
        seq = Sequence(self, index, self.tokenizer, state)
        self.seqs.append(seq)
        return seq

    @property
    def finished(self) -> bool:
        return self.forked and len(self.seqs) == self.params.n and all(s.out.finished for s in self.seqs)

    def output(self) -> RequestOutput:
        """Snapshot for the caller; clears the per-step deltas."""
        outs = []
        for seq in sorted(self.seqs, key=lambda s: s.index):
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
                )
            )
            o.new_text = ""
            o.new_token_ids = []
        self.metrics.num_generated_tokens = sum(len(s.out.token_ids) for s in self.seqs)
        finished = self.finished
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.monotonic()
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, finished, self.metrics)
