"""Small builders shared by the sampler tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from paged_core.sampling import Sampler, SamplingParams, SamplingState


def make_state(
    prompt: Sequence[int] = (1, 2, 3), eos: Sequence[int] = (), index: int = 0, **params: object
) -> SamplingState:
    """A state for ``SamplingParams(**params)`` with a short default prompt."""
    return SamplingState(SamplingParams(**params), list(prompt), index=index, eos_token_ids=eos)  # type: ignore[arg-type]


def draw_counts(logits_row: torch.Tensor, draws: int, seed: int = 0, **params: object) -> Counter[int]:
    """Token frequencies of ``draws`` samples from one row (one batched call through ``num_samples``)."""
    out = Sampler(seed=seed).sample(logits_row.unsqueeze(0), [make_state(**params)], [draws])
    return Counter(out.token_ids[0])


def assert_frequencies(counts: Counter[int], expected: dict[int, float], draws: int) -> None:
    """Each token's frequency is within 5 standard errors (plus a small floor) of its expected probability."""
    assert set(counts) <= {t for t, p in expected.items() if p > 0}, f"drew tokens outside the support: {counts}"
    for token, p in expected.items():
        freq = counts.get(token, 0) / draws
        tolerance = 5 * (p * (1 - p) / draws) ** 0.5 + 2e-3
        assert abs(freq - p) <= tolerance, f"token {token}: frequency {freq:.4f}, expected {p:.4f}"
