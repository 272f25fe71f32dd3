"""What the engine returns per request: completions, finish reasons, logprobs and timing metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestMetrics:
    """Timing and cache figures of one request (times from ``time.monotonic``)."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at first admission."""
    num_generated_tokens: int = 0
    peak_blocks: int | None = None
    """Beam search: the most KV blocks the request's live beams held at once (shared blocks counted once)."""
    peak_blocks_unshared: int | None = None
    """Beam search: what the same beams' block tables added up to, i.e. as many lone requests would hold."""
    num_forks: int | None = None
    """Beam search: beams started as copy-on-write forks."""

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        """Seconds from arrival to completion."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One of a request's ``n`` sequences.

    ``text`` and ``token_ids`` are cumulative; ``new_text`` and
    ``new_token_ids`` are what this step added (for streaming). ``logprobs``
    holds one entry per generated token when requested: a dict from token id
    to log-probability containing the sampled token and the top alternatives.
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None
    new_text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    """Beam search: the sequence's summed token log-probabilities (else None)."""
    score: float | None = None
    """Beam search: ``cumulative_logprob / len(token_ids) ** length_penalty``, what the beams are ranked by."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step (or at the end, from :meth:`LLM.generate`).

    ``error`` is set (and ``outputs`` empty) when the request was refused, or when
    a step failed on it (see :attr:`LLMEngine.failed`); in a batch, a refused or
    failed request never affects the others.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (used by the CLI's ``--json``)."""
        return {
            "request_id": self.request_id,
            "prompt": self.prompt,
            "num_prompt_tokens": len(self.prompt_token_ids),
            "error": self.error,
            "outputs": [
                {"index": o.index, "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason}
                for o in self.outputs
            ],
            "metrics": {
                "time_to_first_token": self.metrics.time_to_first_token,
                "latency": self.metrics.latency,
                "num_prompt_tokens": self.metrics.num_prompt_tokens,
                "num_cached_tokens": self.metrics.num_cached_tokens,
                "num_generated_tokens": self.metrics.num_generated_tokens,
            },
        }
