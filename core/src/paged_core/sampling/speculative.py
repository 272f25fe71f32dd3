"""Verification of draft tokens: which a sequence keeps, so that its output is what decoding without drafts gives.

A row with drafts ``d_1..d_s`` comes with ``s + 1`` logits rows: row ``j`` is the model's prediction
after ``d_j`` (row 0: after the last known token). Greedy rows keep drafts while each is the argmax,
then take the argmax where they stop (or after all ``s``): token for token the greedy output.
Random rows use rejection sampling (Leviathan et al. 2023; Chen et al. 2023): with ``p_j`` the
distribution the sampler would draw from at that position (temperature, top-k, top-p, min-p) and
``q_j`` the draft's, ``d_j`` is kept with probability ``min(1, p_j(d_j) / q_j(d_j))``; at the first
rejection the token comes from ``max(p_j - q_j, 0)`` normalised, and when all are kept a last one is
drawn from ``p_s``. Each output token is then distributed exactly as ``p``. A proposer without a
distribution (n-gram lookup) has ``q_j`` a point mass on ``d_j``: keep with probability ``p_j(d_j)``,
else draw from ``p_j`` with ``d_j`` removed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paged_core.sampling.draw import inverse_cdf
from paged_core.sampling.sampler import Sampler
from paged_core.sampling.state import SamplingState


def verify(
    sampler: Sampler,
    logits: torch.Tensor,
    states: Sequence[SamplingState],
    drafts: Sequence[Sequence[int]],
    draft_probs: Sequence[torch.Tensor | None] | None = None,
) -> list[list[int]]:
    """The tokens each row produces: its kept drafts, then one token of the model's (``1..s+1`` tokens).

    ``logits`` is ``[sum(len(d) + 1), V]``, the rows of each sequence consecutive. States must
    be free of penalties and of an unmet ``min_tokens`` (see
    :func:`~paged_core.speculative.proposer.speculates`): their distribution would depend on the
    drafts kept before each position. Seeded rows draw from their own stream.
    """
    if len(states) != len(drafts):
        raise ValueError(f"got {len(states)} states for {len(drafts)} draft lists")
    expected = sum(len(d) + 1 for d in drafts)
    if logits.dim() != 2 or logits.shape[0] != expected:
        raise ValueError(f"logits must be [{expected}, V] for these drafts; got {tuple(logits.shape)}")
    for i, state in enumerate(states):
        if state.params.has_penalties or state.needs_min_tokens_mask:
            raise ValueError(f"row {i}: penalties and an unmet min_tokens cannot be verified; decode it plainly")
    starts = [0]
    for d in drafts:
        starts.append(starts[-1] + len(d) + 1)
    out: list[list[int]] = [[] for _ in drafts]
    greedy = [i for i, s in enumerate(states) if s.params.is_greedy]
    if greedy:
        best = logits.argmax(dim=-1).tolist()
        for i in greedy:
            out[i] = _keep_greedy(list(drafts[i]), best[starts[i] : starts[i + 1]])
    random = [i for i, s in enumerate(states) if not s.params.is_greedy]
    if random:
        rows = [r for i in random for r in range(starts[i], starts[i + 1])]
        x = logits.float()
        per_row = [states[i] for i in random for _ in range(starts[i], starts[i + 1])]
        probs = Sampler.probabilities(
            x.index_select(0, torch.tensor(rows, device=x.device)), per_row, list(range(len(rows)))
        )
        offset = 0
        for i in random:
            n = starts[i + 1] - starts[i]
            q = draft_probs[i] if draft_probs is not None else None
            out[i] = _keep_sampled(sampler, states[i], list(drafts[i]), probs[offset : offset + n], q)
            offset += n
    return out


def _keep_greedy(drafts: list[int], best: list[int]) -> list[int]:
    kept = 0
    while kept < len(drafts) and drafts[kept] == best[kept]:
        kept += 1
    return [*drafts[:kept], best[kept]]


def _keep_sampled(
    sampler: Sampler, state: SamplingState, drafts: list[int], p: torch.Tensor, q: torch.Tensor | None
) -> list[int]:
    """Rejection sampling of one row: ``p`` is ``[s + 1, V]`` target probabilities, ``q`` ``[s, V]`` or None."""
    s, device = len(drafts), p.device
    gen = state.generator(0, device) if state.params.seed is not None else sampler.shared_generator(device)
    # s acceptance tests, then one draw (from the residual, or the bonus position).
    u = torch.rand(s + 1, dtype=torch.float64, device=device, generator=gen)
    total = p.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    p = p / total  # truncation left unnormalised rows; the ratios need probabilities
    idx = torch.tensor(drafts, dtype=torch.int64, device=device)
    p_d = p[torch.arange(s, device=device), idx].double() if s else p.new_zeros(0).double()
    q_d = q[torch.arange(s, device=device), idx].double() if q is not None and s else torch.ones_like(p_d)
    keep = (u[:s] * q_d < p_d).tolist()
    kept = keep.index(False) if False in keep else s
    if kept == s:
        final = p[s]
    else:
        residual = p[kept].clone()
        if q is None:
            residual[drafts[kept]] = 0.0
        else:
            residual = (residual - q[kept].to(residual.dtype)).clamp_min_(0.0)
        # Zero only when p is (numerically) q itself, in which case the draft was kept with probability 1.
        final = residual if float(residual.sum()) > 0 else p[kept]
    token = int(inverse_cdf(final.unsqueeze(0), u[s:].unsqueeze(0))[0, 0])
    return [*drafts[:kept], token]


def verify_isolated(
    sampler: Sampler,
    logits: torch.Tensor,
    states: Sequence[SamplingState],
    drafts: Sequence[Sequence[int]],
    draft_probs: Sequence[torch.Tensor | None] | None = None,
) -> tuple[list[list[int]], dict[int, Exception]]:
    """:func:`verify` for every row that can be verified, and the error of each row that cannot (as
    :func:`~paged_core.sampling.isolate.sample_isolated` does for plain rows)."""
    try:
        return verify(sampler, logits, states, drafts, draft_probs), {}
    except Exception:
        pass  # retried row by row below, to find the rows responsible
    out: list[list[int]] = []
    failures: dict[int, Exception] = {}
    start = 0
    for i, (state, d) in enumerate(zip(states, drafts, strict=True)):
        end = start + len(d) + 1
        try:
            q = [draft_probs[i]] if draft_probs is not None else None
            out.append(verify(sampler, logits[start:end], [state], [d], q)[0])
        except Exception as exc:
            failures[i] = exc
            out.append([])
        start = end
    return out, failures
