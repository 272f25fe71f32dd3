"""Activations rounded to int8 per 32-wide block: the rule a packed-linear kernel may declare it applies.

Integer dot products multiply four 8-bit values per 32-bit lane, so a kernel that
rounds the activations to int8 decodes and multiplies packed q4/q8 weights several
times faster than one that keeps them in fp32 (ggml's ``q8`` activations; vLLM's
GGUF kernels do the same). :attr:`FusedOps.q8_activation_formats
<paged_core.contract.FusedOps.q8_activation_formats>` names the formats for which
a backend's ``linear`` may do so; the conformance suite then also accepts the
exact product with the activations this function gives.
"""

from __future__ import annotations

import torch

Q8_BLOCK = 32
"""Activations per scale."""
Q8_MAX = 127.0


def round_activations_q8(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., K]`` (``K`` a multiple of 32) as int8 times a per-block scale, returned in fp32.

    Per block of 32 consecutive values along the last dimension, in fp32:
    ``d = max|x| / 127``, ``q = round(x * (1 / d))`` (to nearest, ties to even;
    ``q = 0`` where ``d == 0``), the value ``q * d``. The arithmetic is specified to
    the bit so that a kernel doing the same operations rounds every value the same.
    """
    k = x.shape[-1]
    if k % Q8_BLOCK:
        raise ValueError(f"in_features {k} is not a multiple of the activation block of {Q8_BLOCK}")
    blocks = x.float().reshape(*x.shape[:-1], k // Q8_BLOCK, Q8_BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / Q8_MAX
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse).clamp(-Q8_MAX, Q8_MAX)
    return (q * d).reshape(x.shape)
