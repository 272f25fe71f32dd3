"""What a beam-search request asks for, what the core reports back, and the checks that refuse what it cannot do.

Beam search is deterministic: it ranks continuations by their summed log-probabilities, so the
sampling knobs that reshape or randomise the distribution have no meaning for it and are refused
(naming the field) rather than silently ignored. The rules follow transformers' ``generate(num_beams=W,
do_sample=False)``; see :mod:`paged_core.engine_core.beam` for the search itself.
"""

from __future__ import annotations

import math

import msgspec

from paged_core.errors import RequestRejectedError
from paged_core.sampling.params import SamplingParams

EARLY_STOPPING = (False, True, "never")
"""transformers' ``early_stopping`` values: stop when no running beam can beat the finished ones by a heuristic
(False, the default), as soon as ``width`` beams finished (True), or only when none can win ("never")."""


class BeamParams(msgspec.Struct, frozen=True):
    """Beam search for one request: ``width`` beams, finished ones ranked by ``sum_logprobs / len**length_penalty``.

    The request's :class:`SamplingParams` still carry ``max_tokens``, ``min_tokens``, ``ignore_eos`` and
    ``stop_token_ids`` (extra end-of-sequence ids, like transformers' list of ``eos_token_id``); ``n`` is how
    many of the best finished sequences come back (at most ``width``).
    """

    width: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False


class BeamResult(msgspec.Struct, array_like=True, frozen=True):
    """Sent with each finished beam sequence: its scores and the group's block figures.

    ``peak_blocks`` is the most KV blocks the group's live beams held at once (shared blocks counted
    once); ``peak_blocks_unshared`` is what the same beams' block tables add up to at that moment,
    i.e. what as many lone requests would hold. ``forks`` counts beams started by copy-on-write fork.
    """

    cumulative_logprob: float
    score: float
    peak_blocks: int = 0
    peak_blocks_unshared: int = 0
    forks: int = 0


class BeamRequestError(RequestRejectedError):
    """A beam-search request refused; ``param`` names the field (``beam_width``, ``temperature``...)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_beam(params: SamplingParams, beam: BeamParams, max_num_seqs: int) -> None:
    """Refuse, naming the field and what would work, a beam request the engine cannot honour."""
    width = beam.width
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= max_num_seqs:
        raise BeamRequestError(
            f"beam_width must be an int in [1, {max_num_seqs}] (max_num_seqs: every beam is a batch row); "
            f"got {width!r}",
            "beam_width",
        )
    lp = beam.length_penalty
    if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
        raise BeamRequestError(f"length_penalty must be a finite number; got {lp!r}", "length_penalty")
    if not (isinstance(beam.early_stopping, bool) or beam.early_stopping == "never"):
        raise BeamRequestError(
            f"early_stopping must be true, false or 'never'; got {beam.early_stopping!r}", "early_stopping"
        )
    if params.n > width:
        raise BeamRequestError(
            f"n must be at most the beam width ({width}): beam search returns its best n finished beams; "
            f"got {params.n}",
            "n",
        )
    refused = _unsupported(params)
    if refused is not None:
        param, why = refused
        raise BeamRequestError(f"beam search cannot honour {param}{why}", param)


def _unsupported(p: SamplingParams) -> tuple[str, str] | None:
    """The first sampling field beam search cannot honour and what would work; None if it can honour them all."""
    if p.structured_outputs is not None:
        return "structured_outputs", ": beams cannot follow a grammar; sample greedily with the constraint instead"
    if not p.is_greedy:
        return "temperature", f"={p.temperature}: beams are ranked by log-probability; set temperature 0 (or unset)"
    if p.top_p != 1.0:
        return "top_p", f"={p.top_p}: leave top_p at 1 (every token stays a candidate)"
    if p.top_k not in (0, -1):
        return "top_k", f"={p.top_k}: leave top_k at 0 or -1 (the search takes its top 2 x width itself)"
    if p.min_p != 0.0:
        return "min_p", f"={p.min_p}: leave min_p at 0"
    if p.seed is not None:
        return "seed", f"={p.seed}: beam search draws nothing at random; leave seed unset"
    for name, off in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        if getattr(p, name) != off:
            return name, f"={getattr(p, name)}: leave it at {off:g}"
    if p.logprobs is not None:
        return "logprobs", ": each sequence's cumulative_logprob and score come back instead; leave logprobs unset"
    if p.stop_strings:
        return "stop", " (stop strings): use stop_token_ids, which end a beam as EOS does"
    return None
