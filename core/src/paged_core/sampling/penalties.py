"""Repetition, frequency and presence penalties, applied to a batch of rows at once.

Semantics follow the OpenAI API and vLLM: the repetition penalty divides the
positive logits (and multiplies the negative ones) of every token seen in the
prompt or the output; frequency and presence penalties subtract
``frequency_penalty * count`` and ``presence_penalty * (count > 0)`` for tokens
of the output only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paged_core.sampling.state import SamplingState


def _scatter_index(
    parts: Sequence[torch.Tensor], device: torch.device, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, token, keep) index tensors for per-row token-id tensors; ids outside the vocab are dropped."""
    lengths = torch.tensor([p.numel() for p in parts], device=device)
    rows = torch.repeat_interleave(torch.arange(len(parts), device=device), lengths)
    tokens = torch.cat(list(parts)) if parts else torch.empty(0, dtype=torch.int64, device=device)
    keep = (tokens >= 0) & (tokens < vocab)
    return rows[keep], tokens[keep], keep


def apply_penalties(logits: torch.Tensor, states: Sequence[SamplingState], rows: Sequence[int]) -> None:
    """Penalise ``logits[rows]`` in place (fp32 [B, V]); ``states`` is indexed by row.

    Only the (row, token) entries seen in the history are touched, so the cost
    grows with the history, not with the vocabulary.
    """
    if not rows:
        return
    device, vocab = logits.device, logits.shape[1]
    row_index = torch.tensor(rows, dtype=torch.int64, device=device)
    picked = [states[r] for r in rows]
    out_ids = [torch.tensor(list(s.output_counts), dtype=torch.int64, device=device) for s in picked]

    rep = [s.params.repetition_penalty for s in picked]
    if any(p != 1.0 for p in rep):
        seen = [torch.cat((s.prompt_unique_ids(device), o)) for s, o in zip(picked, out_ids, strict=True)]
        r_idx, t_idx, _ = _scatter_index(seen, device, vocab)
        # A token in both prompt and output appears twice; both writes store the same value.
        where = (row_index[r_idx], t_idx)
        values = logits[where]
        penalty = torch.tensor(rep, dtype=logits.dtype, device=device)[r_idx]
        logits[where] = torch.where(values > 0, values / penalty, values * penalty)

    freq = [s.params.frequency_penalty for s in picked]
    pres = [s.params.presence_penalty for s in picked]
    if any(f != 0.0 for f in freq) or any(p != 0.0 for p in pres):
        r_idx, t_idx, keep = _scatter_index(out_ids, device, vocab)
        counts = torch.tensor(
            [float(c) for s in picked for c in s.output_counts.values()], dtype=logits.dtype, device=device
        )[keep]
        f = torch.tensor(freq, dtype=logits.dtype, device=device)[r_idx]
        p = torch.tensor(pres, dtype=logits.dtype, device=device)[r_idx]
        # Output ids are distinct per row (dict keys), so each entry is written once.
        logits[row_index[r_idx], t_idx] -= f * counts + p


def mask_stop_ids(logits: torch.Tensor, states: Sequence[SamplingState], rows: Sequence[int]) -> None:
    """Set the stop/EOS logits of ``rows`` to -inf in place (rows still short of ``min_tokens``)."""
    if not rows:
        return
    device, vocab = logits.device, logits.shape[1]
    r_idx, t_idx, _ = _scatter_index([states[r].stop_ids_tensor(device) for r in rows], device, vocab)
    row_index = torch.tensor(rows, dtype=torch.int64, device=device)
    logits[row_index[r_idx], t_idx] = float("-inf")
