"""What :meth:`LLM.beam_search <paged_core.frontend.llm.LLM.beam_search>` returns: sequences best first, with scores."""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_core.frontend.outputs import RequestMetrics, RequestOutput


@dataclass
class BeamSequence:
    """One finished beam: its text and token ids (an ending EOS included), summed log-probability and score.

    ``score`` is ``cumulative_logprob / len(token_ids) ** length_penalty``, what the beams were ranked by;
    ``finish_reason`` is ``stop`` (an EOS or stop token id) or ``length``.
    """

    text: str
    token_ids: list[int]
    cumulative_logprob: float
    score: float
    finish_reason: str


@dataclass
class BeamSearchOutput:
    """The best beams of one prompt, best first, and the request's metrics.

    ``metrics.peak_blocks`` is the most KV blocks its beams held at once, shared blocks counted once;
    ``metrics.peak_blocks_unshared`` what the same block tables add up to (as many lone requests would
    hold). ``error`` is set (and ``sequences`` empty) when the prompt was refused or its search failed.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[BeamSequence] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))
    error: str | None = None

    @classmethod
    def of(cls, out: RequestOutput) -> BeamSearchOutput:
        """From the engine's cumulative output of a finished beam-search request."""
        seqs = [
            BeamSequence(o.text, list(o.token_ids), o.cumulative_logprob, o.score, o.finish_reason or "length")
            for o in out.outputs
            if o.cumulative_logprob is not None and o.score is not None
        ]
        return cls(out.request_id, out.prompt, out.prompt_token_ids, seqs, out.metrics, out.error)
