"""Token shares of the expert-parallel dispatch (the collectives run on two ranks in test_experts.py)."""

from __future__ import annotations

import itertools

import pytest

from paged_core.parallel.dispatch import token_slice


@pytest.mark.parametrize("tokens", [0, 1, 2, 3, 7, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shares_are_contiguous_in_rank_order_and_differ_by_at_most_one(tokens: int, world: int) -> None:
    shares = [token_slice(tokens, r, world) for r in range(world)]
    assert shares[0].start == 0 and shares[-1].stop == tokens
    assert all(a.stop == b.start for a, b in itertools.pairwise(shares))
    sizes = [s.stop - s.start for s in shares]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1 and min(sizes) >= 0


def test_fewer_tokens_than_ranks_leave_the_last_ranks_empty() -> None:
    assert [token_slice(2, r, 4) for r in range(4)] == [slice(0, 1), slice(1, 2), slice(2, 2), slice(2, 2)]
    with pytest.raises(ValueError):
        token_slice(4, 2, 2)
