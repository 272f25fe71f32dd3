"""Top-k, top-p and min-p: exact kept sets, and thousands of draws never leaving them."""

from __future__ import annotations

import pytest
import torch

from paged_core.sampling import Sampler
from paged_core.sampling.filters import keep_threshold

from .helpers import assert_frequencies, draw_counts, make_state

# Distinct logits on a small vocab.
LOGITS = torch.tensor([0.5, 2.0, -1.0, 1.5, 0.0, 3.0, -0.5, 1.0])
ORDER = LOGITS.argsort(descending=True).tolist()  # [5, 1, 3, 7, 0, 4, 6, 2]
PROBS = LOGITS.softmax(-1)


def kept_sets(
    probs: torch.Tensor,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
    min_p: list[float] | None = None,
) -> list[set[int]]:
    threshold = keep_threshold(
        probs,
        None if top_k is None else torch.tensor(top_k),
        None if top_p is None else torch.tensor(top_p),
        None if min_p is None else torch.tensor(min_p),
    )
    return [set(torch.nonzero(row >= t).flatten().tolist()) for row, t in zip(probs, threshold, strict=True)]


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 100])
def test_top_k_keeps_exactly_the_k_largest(k: int) -> None:
    assert kept_sets(PROBS.unsqueeze(0), top_k=[k]) == [set(ORDER[:k])]


def test_top_k_keeps_ties_with_the_kth_value() -> None:
    probs = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]]).softmax(-1)
    assert kept_sets(probs, top_k=[2]) == [{1, 2, 3}]


def smallest_nucleus(probs: list[float], p: float) -> set[int]:
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    mass, chosen = 0.0, set()
    for i in order:
        chosen.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return chosen


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.75, 0.9, 0.99])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p: float) -> None:
    assert kept_sets(PROBS.unsqueeze(0), top_p=[p]) == [smallest_nucleus(PROBS.tolist(), p)]


def test_top_p_one_keeps_every_token_even_with_rounding() -> None:
    probs = (torch.randn(4, 5000, generator=torch.Generator().manual_seed(0)) * 8).softmax(-1)
    assert torch.equal(keep_threshold(probs, None, torch.ones(4), None), torch.zeros(4))


def test_top_p_applies_after_top_k_within_the_k_set() -> None:
    k = 3
    renormalised = LOGITS[ORDER[:k]].softmax(-1).tolist()
    expected = {ORDER[i] for i in smallest_nucleus(renormalised, 0.8)}
    assert kept_sets(PROBS.unsqueeze(0), top_k=[k], top_p=[0.8]) == [expected]


def test_rows_are_filtered_independently() -> None:
    got = kept_sets(PROBS.repeat(4, 1), top_k=[1, 8, 4, 8], top_p=[1.0, 0.5, 1.0, 1.0], min_p=[0, 0, 0, 0.3])
    above = {t for t in range(8) if PROBS[t] >= 0.3 * PROBS.max()}
    assert got == [{ORDER[0]}, smallest_nucleus(PROBS.tolist(), 0.5), set(ORDER[:4]), above]


def test_min_p_keeps_tokens_at_or_above_the_scaled_maximum() -> None:
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.1, 0.025], [0.5, 0.25, 0.125, 0.1, 0.025]])
    assert kept_sets(probs, min_p=[0.25, 0.0]) == [{0, 1, 2}, {0, 1, 2, 3, 4}]


@pytest.mark.parametrize("p", [0.5, 0.9, 0.999])
def test_wide_nuclei_beyond_the_candidate_counts_match_a_full_sort(p: float) -> None:
    # Flat rows need most of a large vocabulary: the candidate heads fall short and a full sort decides.
    probs = (torch.randn(3, 6000, generator=torch.Generator().manual_seed(1)) * 0.3).softmax(-1)
    got = kept_sets(probs, top_p=[p, p, 1.0], top_k=[6000, 30, 6000])
    ordered = probs[0].sort(descending=True)
    size = int((ordered.values.cumsum(-1) < p).sum()) + 1
    assert size > 1024
    assert got[0] == set(ordered.indices[:size].tolist())
    head = probs[1].topk(30)
    nucleus = smallest_nucleus((head.values / head.values.sum()).tolist(), p)
    assert got[1] == {head.indices[i].item() for i in nucleus}
    assert got[2] == set(range(6000))


DRAWS = 6000


@pytest.mark.parametrize("k", [1, 3, 5])
def test_top_k_draws_stay_in_the_set_with_renormalised_frequencies(k: int) -> None:
    counts = draw_counts(LOGITS, DRAWS, seed=k, top_k=k)
    allowed = ORDER[:k]
    expected = dict(zip(allowed, LOGITS[allowed].softmax(-1).tolist(), strict=True))
    assert_frequencies(counts, {t: expected.get(t, 0.0) for t in range(8)}, DRAWS)
    assert set(counts) == set(allowed)


@pytest.mark.parametrize("p", [0.3, 0.7, 0.9])
def test_top_p_draws_stay_in_the_nucleus(p: float) -> None:
    counts = draw_counts(LOGITS, DRAWS, seed=11, top_p=p)
    nucleus = sorted(smallest_nucleus(PROBS.tolist(), p))
    renorm = dict(zip(nucleus, LOGITS[nucleus].softmax(-1).tolist(), strict=True))
    assert_frequencies(counts, {t: renorm.get(t, 0.0) for t in range(8)}, DRAWS)


@pytest.mark.parametrize("min_p", [0.1, 0.3, 0.6])
def test_min_p_draws_stay_above_the_threshold(min_p: float) -> None:
    counts = draw_counts(LOGITS, DRAWS, seed=7, min_p=min_p)
    allowed = [t for t in range(8) if PROBS[t] >= min_p * PROBS.max()]
    renorm = dict(zip(allowed, LOGITS[allowed].softmax(-1).tolist(), strict=True))
    assert_frequencies(counts, {t: renorm.get(t, 0.0) for t in range(8)}, DRAWS)


def test_all_filters_and_temperature_together() -> None:
    # temperature 0.5 -> top-k 5 -> top-p 0.9 -> min-p 0.2, computed by hand in that order.
    counts = draw_counts(LOGITS, DRAWS, seed=13, temperature=0.5, top_k=5, top_p=0.9, min_p=0.2)
    scaled = LOGITS / 0.5
    top5 = ORDER[:5]
    nucleus = [top5[i] for i in sorted(smallest_nucleus(scaled[top5].softmax(-1).tolist(), 0.9))]
    probs = scaled[nucleus].softmax(-1)
    final = [t for t, q in zip(nucleus, probs.tolist(), strict=True) if q >= 0.2 * probs.max().item()]
    renorm = dict(zip(final, scaled[final].softmax(-1).tolist(), strict=True))
    assert_frequencies(counts, {t: renorm.get(t, 0.0) for t in range(8)}, DRAWS)
    assert len(final) < 5  # the combination really truncates beyond top-k alone


def test_large_vocab_batched_draws_never_leave_top_k() -> None:
    logits = torch.randn(8, 4096, generator=torch.Generator().manual_seed(4))
    states = [make_state(top_k=10, top_p=0.95, seed=i if i % 2 else None) for i in range(8)]
    out = Sampler(seed=1).sample(logits, states, [200] * 8)
    for row in range(8):
        allowed = set(logits[row].topk(10).indices.tolist())
        assert set(out.token_ids[row]) <= allowed
