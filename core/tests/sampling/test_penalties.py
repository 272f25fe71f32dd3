"""Repetition, frequency and presence penalties: exact values on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from paged_core.sampling import Sampler
from paged_core.sampling.penalties import apply_penalties

from .helpers import make_state

LOGITS = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]


def penalised(prompt: list[int], outputs: list[int], **params: object) -> list[float]:
    state = make_state(prompt=prompt, **params)
    for t in outputs:
        state.append(t)
    x = torch.tensor([LOGITS])
    apply_penalties(x, [state], [0])
    return x[0].tolist()


def test_repetition_divides_positive_and_multiplies_negative_over_prompt_and_output() -> None:
    got = penalised([0, 1], [2, 2], repetition_penalty=2.0)
    assert got == [1.0, -2.0, 0.25, 3.0, -2.0, 1.0]


def test_repetition_below_one_rewards_seen_tokens() -> None:
    got = penalised([0, 4], [], repetition_penalty=0.5)
    assert got == [4.0, -1.0, 0.5, 3.0, -1.0, 1.0]


def test_frequency_and_presence_count_output_tokens_only() -> None:
    # Prompt token 3 is not penalised; output 2 appears twice, 5 once.
    got = penalised([3], [2, 5, 2], frequency_penalty=0.5, presence_penalty=0.25)
    assert got == pytest.approx([2.0, -1.0, 0.5 - 1.0 - 0.25, 3.0, -2.0, 1.0 - 0.5 - 0.25])


def test_negative_frequency_and_presence_encourage_repeats() -> None:
    got = penalised([], [1, 1, 1], frequency_penalty=-1.0, presence_penalty=-2.0)
    assert got == pytest.approx([2.0, -1.0 + 3.0 + 2.0, 0.5, 3.0, -2.0, 1.0])


def test_all_three_apply_repetition_first() -> None:
    got = penalised([0], [0, 4], repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5)
    assert got == pytest.approx([2.0 / 2 - 1.0 - 0.5, -1.0, 0.5, 3.0, -2.0 * 2 - 1.0 - 0.5, 1.0])


def test_only_the_named_rows_change_and_rows_use_their_own_history() -> None:
    a = make_state(prompt=[0], repetition_penalty=2.0)
    b = make_state(prompt=[1], frequency_penalty=1.0)
    b.append(3)
    c = make_state(prompt=[0], repetition_penalty=4.0)
    x = torch.tensor([LOGITS, LOGITS, LOGITS, LOGITS])
    apply_penalties(x, [a, b, make_state(), c], [0, 1, 3])
    assert x[0].tolist() == [1.0, *LOGITS[1:]]
    assert x[1].tolist() == [2.0, -1.0, 0.5, 2.0, -2.0, 1.0]
    assert x[2].tolist() == LOGITS
    assert x[3].tolist() == [0.5, *LOGITS[1:]]


def test_penalties_steer_greedy_choice_through_the_sampler() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.5]])
    state = make_state(prompt=[0], temperature=0, presence_penalty=1.0)
    assert Sampler().sample(logits, [state]).token_ids == [[1]]
    state.append(1)  # now 1 scores 2.0 < 2.5
    assert Sampler().sample(logits, [state]).token_ids == [[2]]


def test_fork_copies_history() -> None:
    parent = make_state(prompt=[0], frequency_penalty=1.0)
    parent.append(2)
    child = parent.fork(1)
    child.append(2)
    assert parent.output_counts == {2: 1} and child.output_counts == {2: 2}
    assert child.output_token_ids == [2, 2] and child.index == 1
