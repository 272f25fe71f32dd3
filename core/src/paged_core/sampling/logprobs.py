"""Log-probabilities of sampled tokens under the model's raw (unprocessed) distribution."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paged_core.sampling.rows import take_rows


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token's log-probability, its rank, and the most likely alternatives.

    ``rank`` is 1 + the number of tokens strictly more likely than the sampled
    one; ``top`` holds ``(token_id, logprob)`` pairs, most likely first, as many
    as the request's ``logprobs`` asked for (empty for ``logprobs=0``). All
    values come from ``log_softmax`` of the logits before penalties,
    temperature or truncation.
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def compute_logprobs(
    raw_logits: torch.Tensor, sample_rows: Sequence[int], tokens: torch.Tensor, num_top: Sequence[int]
) -> list[TokenLogprobs]:
    """Logprobs of ``tokens[i]`` drawn from row ``sample_rows[i]`` of ``raw_logits`` [B, V].

    ``num_top[i]`` is how many alternatives sample ``i`` reports. Only the rows
    named are normalised, and the host sees one transfer per quantity.
    """
    if not sample_rows:
        return []
    logp = torch.log_softmax(take_rows(raw_logits, sample_rows).float(), dim=-1)
    chosen = logp.gather(1, tokens.unsqueeze(1))
    ranks = torch.count_nonzero(logp > chosen, dim=-1) + 1
    k = min(max(num_top), logp.shape[1])
    top_values, top_ids = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], logp[:, :0].long())
    out: list[TokenLogprobs] = []
    columns = zip(
        tokens.tolist(),
        chosen.squeeze(1).tolist(),
        ranks.tolist(),
        top_ids.tolist(),
        top_values.tolist(),
        num_top,
        strict=True,
    )
    for token, value, rank, ids, values, n in columns:
        out.append(TokenLogprobs(token, value, rank, tuple(zip(ids[:n], values[:n], strict=True))))
    return out
