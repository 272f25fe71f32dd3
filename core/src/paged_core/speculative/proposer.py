"""The proposer interface, which sequences speculate, and the acceptance statistics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from paged_core.config import SpeculativeConfig

if TYPE_CHECKING:
    from paged_core.sampling.state import SamplingState
    from paged_core.sched.request import Request


@dataclass(slots=True)
class Proposal:
    """Draft tokens for one sequence and, from a draft model, the distribution each was drawn from.

    ``probs`` is ``[len(tokens), V]`` (rows sum to 1) or ``None`` when the drafts are certain
    (n-gram lookup): verification then treats each as a point mass.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """Proposes draft tokens for sequences about to decode.

    ``needs_lookahead``: the proposer writes KV past the scheduled tokens (a draft model), so the
    scheduler must reserve ``num_speculative_tokens`` lookahead slots per row.
    """

    name: str
    needs_lookahead: bool

    def propose(
        self, reqs: Sequence[Request], ks: Sequence[int], states: Sequence[SamplingState]
    ) -> list[Proposal | None]:
        """At most ``ks[i]`` drafts to follow ``reqs[i]``'s tokens (prompt + output so far), or ``None``.

        Each request's last token is its only uncomputed one; ``states[i]`` is its sampling state.
        """
        ...


def speculates(state: SamplingState, allowed: bool) -> bool:
    """Whether a sequence may take drafts this step.

    Drafts are verified against the distribution the sampler would draw from; rows whose
    distribution depends on the tokens before it in ways verification does not replay are left to
    plain decoding: penalties (they count earlier outputs), an unmet ``min_tokens`` (it masks stop
    ids by output length) and ``logprobs`` (reported per sampled token). ``allowed`` is the
    request's own opt-out.
    """
    params = state.params
    return allowed and not params.has_penalties and not state.needs_min_tokens_mask and params.logprobs is None


@dataclass
class SpecStats:
    """Cumulative figures of speculation: rows verified, drafts proposed and drafts accepted."""

    verify_rows: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def record(self, drafts: int, accepted: int) -> None:
        self.verify_rows += 1
        self.draft_tokens += drafts
        self.accepted_tokens += accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts (0 before any)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per verify row: accepted drafts plus the model's own one (1 before any)."""
        return 1.0 + self.accepted_tokens / self.verify_rows if self.verify_rows else 1.0


def make_proposer(config: SpeculativeConfig) -> Proposer | None:
    """The proposer ``config`` names (``None`` when speculation is off); a draft model is loaded elsewhere."""
    from paged_core.speculative.ngram import NgramProposer

    if config.speculative is None:
        return None
    if config.speculative == "ngram":
        return NgramProposer(config.prompt_lookup_max, config.prompt_lookup_min)
    raise NotImplementedError("draft-model proposers are built by the engine with the target's parts")
