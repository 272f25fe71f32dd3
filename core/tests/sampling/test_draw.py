"""inverse_cdf: exact lookups, edges of [0, 1), zero-probability tokens, ragged vocabularies."""

from __future__ import annotations

import pytest
import torch

from paged_core.sampling.draw import BLOCK, inverse_cdf

ALMOST_ONE = 1.0 - 2.0**-53


def test_lookup_follows_the_cumulative_distribution() -> None:
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    u = torch.tensor([[0.0, 0.05, 0.11, 0.29, 0.31, 0.61, 0.99, ALMOST_ONE]], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [[0, 0, 1, 1, 2, 3, 3, 3]]


def test_unnormalised_rows_are_scaled_by_their_total() -> None:
    probs = torch.tensor([[2.0, 0.0, 6.0]])
    u = torch.tensor([[0.2, 0.3, ALMOST_ONE]], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [[0, 2, 2]]


@pytest.mark.parametrize("vocab", [1, 7, BLOCK, BLOCK + 1, 3 * BLOCK - 5])
def test_zero_probability_tokens_are_never_drawn(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    probs = torch.rand(3, vocab, generator=gen)
    probs[probs < 0.7] = 0.0
    probs[:, -1] = 0.0 if vocab > 1 else 1.0
    probs[0, 0] = 1.0  # every row keeps some mass
    probs[1, : vocab // 2] = 0.0
    probs[1, vocab // 2] = 1e-30  # a tiny but positive token
    edges = torch.tensor([0.0, 1e-300, 0.5, ALMOST_ONE], dtype=torch.float64)
    u = torch.cat([edges, torch.rand(2000, dtype=torch.float64, generator=gen)]).repeat(3, 1)
    drawn = inverse_cdf(probs, u)
    assert drawn.min() >= 0 and drawn.max() < vocab
    assert bool((probs.gather(1, drawn) > 0).all())


def test_all_mass_in_the_last_ragged_block() -> None:
    probs = torch.zeros(1, 2 * BLOCK + 3)
    probs[0, -2] = 1.0
    u = torch.tensor([[0.0, 0.5, ALMOST_ONE]], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [[2 * BLOCK + 1] * 3]


def test_frequencies_across_blocks() -> None:
    probs = torch.zeros(1, 4 * BLOCK)
    probs[0, [3, BLOCK + 7, 3 * BLOCK + 255]] = torch.tensor([0.5, 0.25, 0.25])
    u = torch.rand(1, 40000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(inverse_cdf(probs, u)[0], minlength=4 * BLOCK)
    assert counts.sum() == counts[[3, BLOCK + 7, 3 * BLOCK + 255]].sum()
    assert counts[3] / 40000 == pytest.approx(0.5, abs=0.015)
    assert counts[BLOCK + 7] / 40000 == pytest.approx(0.25, abs=0.015)
