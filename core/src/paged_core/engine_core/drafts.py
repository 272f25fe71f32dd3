"""Speculative decoding inside the core: drafts proposed after a step, verified by the next.

After each step's update, :meth:`Drafts.propose` asks the proposer for drafts for every sampled
sequence about to decode that may speculate (:func:`~paged_core.speculative.speculates`), and hands
them to the scheduler (:meth:`~paged_core.sched.scheduler.Scheduler.set_drafts`), which runs them
after the sequence's last token. The rows of such a sequence come back ``1 + drafts`` long, and
:meth:`Drafts.verify` keeps the longest prefix the target agrees with plus one token of its own; the
scheduler's update rolls the rejected drafts back.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping

from paged_core.engine_core.grammars import Grammars
from paged_core.engine_core.rows import Rows
from paged_core.engine_core.sampled import Seq
from paged_core.sampling.sampler import Sampler, SamplingState
from paged_core.sampling.speculative import verify_isolated
from paged_core.sched.output import SchedulerOutput
from paged_core.sched.request import Request
from paged_core.sched.scheduler import Scheduler
from paged_core.speculative import Proposal, Proposer, SpecStats, speculates

log = logging.getLogger("paged.engine")


class Verified:
    """What verifying a step's draft rows gave: the kept tokens per scheduler id, and the requests that failed."""

    __slots__ = ("failures", "token_ids")

    def __init__(self) -> None:
        self.token_ids: dict[str, list[int]] = {}
        self.failures: dict[str, str] = {}


class Drafts:
    """The drafts of sampled sequences: proposed for the next step, verified against the rows that ran them."""

    def __init__(
        self,
        scheduler: Scheduler,
        sampler: Sampler,
        proposer: Proposer | None,
        num_tokens: int,
        grammars: Grammars | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.grammars = grammars
        """Structured outputs: a constrained sequence's verify rows are masked along its draft."""
        self.sampler = sampler
        self.proposer = proposer
        """Who proposes drafts (``None`` when speculation is off: no row ever has drafts)."""
        self.num_tokens = num_tokens
        self.stats = SpecStats()
        self._proposals: dict[str, Proposal] = {}  # scheduler id -> the drafts it runs in the next step

    def verify(self, rows: Rows, out: SchedulerOutput, seqs: Mapping[str, Seq]) -> Verified:
        """Verify the rows that ran drafts: the tokens each keeps (a row that cannot be verified fails alone)."""
        verified = Verified()
        if not rows:
            return verified
        assert rows.logits is not None
        spec_seqs = [seqs[rid] for rid in rows.req_ids]
        drafts = [list(out.scheduled_spec_decode_tokens[rid]) for rid in rows.req_ids]
        proposals = self._proposals
        probs = [
            p.probs[: len(d)] if (p := proposals.pop(s.seq_id, None)) is not None and p.probs is not None else None
            for s, d in zip(spec_seqs, drafts, strict=True)
        ]
        if self.grammars is not None:
            self._mask(rows, spec_seqs, drafts)
        kept, errors = verify_isolated(
            self.sampler,
            rows.logits,
            [s.state for s in spec_seqs],
            drafts,
            probs if any(p is not None for p in probs) else None,
        )
        for i, (seq, toks) in enumerate(zip(spec_seqs, kept, strict=True)):
            if (exc := errors.get(i)) is not None:
                log.error("request %s: verifying its drafts failed; ending it alone", seq.request_id, exc_info=exc)
                verified.failures[seq.request_id] = f"sampling failed for this request ({type(exc).__name__})"
                continue
            verified.token_ids[seq.seq_id] = toks
            self.stats.record(len(drafts[i]), len(toks) - 1)
        return verified

    def _mask(self, rows: Rows, spec_seqs: list[Seq], drafts: list[list[int]]) -> None:
        """Mask the verify rows of constrained sequences: a draft token the grammar refuses is rejected for sure."""
        assert self.grammars is not None and rows.logits is not None
        starts = list(itertools.accumulate(rows.counts, initial=0))
        which = [i for i, s in enumerate(spec_seqs) if s.matcher is not None]
        if which:
            self.grammars.mask_drafts(
                rows.logits,
                [starts[i] for i in which],
                [m for i in which if (m := spec_seqs[i].matcher) is not None],
                [drafts[i] for i in which],
            )

    def propose(self, seqs: Mapping[str, Seq]) -> None:
        """Drafts for the next step, for every sampled sequence that is about to decode and may speculate."""
        self._proposals.clear()
        if self.proposer is None:
            return
        asking: list[Request] = []
        ks: list[int] = []
        states: list[SamplingState] = []
        for req in self.scheduler.about_to_decode():
            seq = seqs.get(req.request_id)
            if seq is None or not speculates(seq.state, seq.group.request.params.speculate):
                continue
            # Drafts past max_tokens would be dropped by the stop check: do not propose them.
            room = min(self.num_tokens, req.max_tokens - req.num_output_tokens - 1)
            if room >= 1:
                asking.append(req)
                ks.append(room)
                states.append(seq.state)
        if not asking:
            return
        for req, proposal in zip(asking, self.proposer.propose(asking, ks, states), strict=True):
            if proposal is not None and proposal.tokens:
                self.scheduler.set_drafts(req.request_id, proposal.tokens)
                self._proposals[req.request_id] = proposal
