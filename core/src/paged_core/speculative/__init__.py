"""Speculative decoding: proposers of draft tokens, and the statistics of their acceptance.

Each step the core asks a :class:`~paged_core.speculative.proposer.Proposer` for up to
``num_speculative_tokens`` drafts per eligible sequence and puts them in the scheduler's
``spec_token_ids``. The scheduler budgets ``1 + k`` tokens for such a row; the runner runs the
drafts after the row's last known token and returns logits for every one of those positions, and
:func:`~paged_core.sampling.speculative.verify` keeps the longest prefix of drafts the target
model agrees with plus one token of its own (greedy: exactly the tokens of decoding without drafts;
sampled: rejection sampling, so outputs are distributed exactly as without drafts). Rejected
drafts' KV slots are rewritten by later steps (the scheduler rolls ``num_computed_tokens`` back).

Not every sequence speculates: see :func:`~paged_core.speculative.proposer.speculates`.
"""

from paged_core.speculative.ngram import NgramProposer
from paged_core.speculative.proposer import Proposal, Proposer, SpecStats, make_proposer, speculates

__all__ = ["NgramProposer", "Proposal", "Proposer", "SpecStats", "make_proposer", "speculates"]
