"""sample_isolated: a batch that raises is retried row by row, and only the rows that fail again are lost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from paged_core.sampling import Sampler, SamplerOutput, SamplingState
from paged_core.sampling.isolate import sample_isolated

from .helpers import make_state


class PickySampler(Sampler):
    """Raises for any call that includes a state whose seed is 13; counts its calls."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.calls: list[int] = []

    def sample(self, logits: torch.Tensor, states: Sequence[SamplingState], num_samples: Any = None) -> SamplerOutput:
        self.calls.append(len(states))
        if any(s.params.seed == 13 for s in states):
            raise OverflowError("Overflow when unpacking long long")
        return super().sample(logits, states, num_samples)


def test_the_batched_call_is_the_only_call_when_it_succeeds() -> None:
    sampler = PickySampler()
    states = [make_state(temperature=0), make_state(seed=1)]
    out, failures = sample_isolated(sampler, torch.randn(2, 9), states, [1, 1])
    assert failures == {} and sampler.calls == [2] and [len(t) for t in out.token_ids] == [1, 1]


def test_only_the_failing_row_is_lost() -> None:
    sampler = PickySampler()
    logits = torch.full((3, 8), -10.0)
    logits[0, 2] = logits[1, 5] = logits[2, 7] = 10.0
    states = [make_state(temperature=0), make_state(seed=13, logprobs=1), make_state(temperature=0, logprobs=2)]
    out, failures = sample_isolated(sampler, logits, states, [1, 1, 2])
    assert list(failures) == [1] and isinstance(failures[1], OverflowError)
    assert out.token_ids == [[2], [], [7, 7]]
    assert out.logprobs[0] is None and out.logprobs[1] is None
    assert out.logprobs[2] is not None and [lp.token_id for lp in out.logprobs[2]] == [7, 7]
    assert sampler.calls == [3, 1, 1, 1]


def test_every_row_failing_is_reported_row_by_row() -> None:
    sampler = PickySampler()
    out, failures = sample_isolated(sampler, torch.randn(2, 4), [make_state(seed=13)] * 2, [1, 1])
    assert sorted(failures) == [0, 1] and out.token_ids == [[], []]


def test_a_huge_top_k_next_to_a_small_one_samples() -> None:
    # The reproduction of issue 15: top_k past int64's range in a batch where another row sets top_k. The
    # params now refuse it; past the vocabulary it is treated as off, so the tensor never sees it.
    states = [make_state(top_k=2**63 - 1, seed=1), make_state(top_k=2, seed=2)]
    out = Sampler(seed=0).sample(torch.randn(2, 16), states)
    assert [len(t) for t in out.token_ids] == [1, 1]


@pytest.mark.parametrize("bad_row", [0, 2])
def test_rows_keep_their_positions(bad_row: int) -> None:
    sampler = PickySampler()
    logits = torch.full((3, 6), -10.0)
    for row in range(3):
        logits[row, row] = 10.0
    states = [make_state(seed=13 if r == bad_row else 20 + r, temperature=0) for r in range(3)]
    out, failures = sample_isolated(sampler, logits, states, [1, 1, 1])
    assert list(failures) == [bad_row]
    assert out.token_ids == [[] if r == bad_row else [r] for r in range(3)]
