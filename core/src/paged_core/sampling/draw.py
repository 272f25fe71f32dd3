"""Inverse-CDF draws from unnormalised probability rows, exact to float64 and cheap on a CPU.

One uniform per sample replaces the vocabulary-sized noise of the
exponential-race or Gumbel tricks. The CDF is two-level (block sums, then a
cumulative sum inside the chosen block) so float64 precision is kept without
a float64 copy of the whole batch, and a zero-probability token is never drawn.
"""

from __future__ import annotations

import torch

BLOCK = 256


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ids [R, S] for ``uniforms`` [R, S] (float64 in [0, 1)) against ``probs`` [R, V] (>= 0).

    Token ``t`` of row ``r`` is drawn with probability ``probs[r, t] / probs[r].sum()``;
    every row must have some positive mass.
    """
    rows, vocab = probs.shape
    blocks_n = -(-vocab // BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks_n * BLOCK - vocab)) if vocab % BLOCK else probs
    blocks = padded.reshape(rows, blocks_n, BLOCK)
    # Block sums in fp32 (a float64 sum would first copy the whole batch to float64).
    block_cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)
    total = block_cdf[:, -1:]
    # Strictly below the total, so the block found has positive mass.
    target = torch.minimum(uniforms.to(torch.float64) * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks_n - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    inside = blocks.gather(1, block.unsqueeze(-1).expand(-1, -1, BLOCK)).cumsum(dim=-1, dtype=torch.float64)
    last = inside[..., -1]
    # Block sums and in-block running sums may round apart; stay inside the block's own mass.
    residual = torch.minimum(target - before, torch.nextafter(last, torch.zeros_like(last)))
    offset = torch.searchsorted(inside, residual.unsqueeze(-1), right=True).squeeze(-1)
    # The clamp only matters for rows without positive mass (NaN logits): keep ids in range.
    return (block * BLOCK + offset).clamp_(max=vocab - 1)
