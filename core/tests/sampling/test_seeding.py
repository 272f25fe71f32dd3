"""Seeded sampling: reproducible, independent of the batch, distinct across the n samples."""

from __future__ import annotations

import torch

from paged_core.sampling import Sampler, SamplingState
from paged_core.sampling.state import stream_seed

from .helpers import make_state

VOCAB = 500
STEPS = 40


def step_logits(step: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(1000 + step))


def run_alone(state: SamplingState, sampler: Sampler) -> list[int]:
    tokens = []
    for step in range(STEPS):
        (token,) = sampler.sample(step_logits(step), [state]).token_ids[0]
        state.append(token)
        tokens.append(token)
    return tokens


PARAMS = {"seed": 1234, "temperature": 0.9, "top_p": 0.95, "frequency_penalty": 0.3}


def test_same_seed_same_tokens_across_samplers() -> None:
    first = run_alone(make_state(**PARAMS), Sampler(seed=1))
    second = run_alone(make_state(**PARAMS), Sampler(seed=2))
    assert first == second
    assert len(set(first)) > 5  # a real random sequence, not a constant


def test_different_seeds_differ() -> None:
    a = run_alone(make_state(**PARAMS), Sampler())
    b = run_alone(make_state(**{**PARAMS, "seed": 1235}), Sampler())
    assert a != b


def test_seeded_row_ignores_batch_composition_and_position() -> None:
    expected = run_alone(make_state(**PARAMS), Sampler(seed=0))
    layouts = [
        (0, 3),  # first of three rows
        (4, 6),  # in the middle of six
        (2, 3),  # last of three
    ]
    for position, rows in layouts:
        sampler = Sampler(seed=position)
        target = make_state(**PARAMS)
        others = [
            make_state(seed=77 + i, top_k=20) if i % 2 else make_state(temperature=1.3, min_p=0.05)
            for i in range(rows - 1)
        ]
        got = []
        for step in range(STEPS):
            batch = step_logits(10_000 + step, rows)
            batch[position] = step_logits(step)[0]
            states = [*others[:position], target, *others[position:]]
            # Neighbours change how many samples they ask for, too.
            counts = [1 + (step + i) % 3 if s is not target else 1 for i, s in enumerate(states)]
            out = sampler.sample(batch, states, counts)
            token = out.token_ids[position][0]
            target.append(token)
            got.append(token)
        assert got == expected, f"row {position} of {rows} diverged"


def test_greedy_neighbours_do_not_disturb_seeded_rows() -> None:
    expected = run_alone(make_state(**PARAMS), Sampler())
    target, greedy = make_state(**PARAMS), make_state(temperature=0)
    got = []
    for step in range(STEPS):
        batch = torch.cat([step_logits(50_000 + step), step_logits(step)])
        token = Sampler().sample(batch, [greedy, target]).token_ids[1][0]
        target.append(token)
        got.append(token)
    assert got == expected


def test_n_samples_of_one_row_differ_and_are_reproducible() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: four equal draws would be a broken stream split
    first = Sampler().sample(logits, [make_state(seed=5)], [4]).token_ids[0]
    again = Sampler().sample(logits, [make_state(seed=5)], [4]).token_ids[0]
    assert first == again
    assert len(set(first)) == 4


def test_unseeded_samples_of_one_row_differ() -> None:
    draws = Sampler(seed=0).sample(torch.zeros(1, VOCAB), [make_state()], [4]).token_ids[0]
    assert len(set(draws)) == 4


def test_forked_children_continue_their_stream_like_a_fresh_state_of_that_index() -> None:
    parent = make_state(**PARAMS)
    (firsts,) = Sampler().sample(step_logits(0), [parent], [3]).token_ids
    children = [parent.fork(j) for j in range(3)]
    for j, child in enumerate(children):
        reference = make_state(index=j, **PARAMS)
        expected = run_alone(reference, Sampler())
        child.append(firsts[j])
        tail = []
        for step in range(1, STEPS):
            (token,) = Sampler().sample(step_logits(step), [child]).token_ids[0]
            child.append(token)
            tail.append(token)
        assert [firsts[j], *tail] == expected


def test_unseeded_rows_share_the_sampler_generator() -> None:
    logits = torch.zeros(2, VOCAB)
    a = Sampler(seed=3).sample(logits, [make_state(), make_state()]).token_ids
    b = Sampler(seed=3).sample(logits, [make_state(), make_state()]).token_ids
    c = Sampler(seed=4).sample(logits, [make_state(), make_state()]).token_ids
    assert a == b and a != c


def test_stream_seeds_depend_on_seed_and_index() -> None:
    seeds = {stream_seed(s, i) for s in range(-2, 3) for i in range(3)}
    assert len(seeds) == 15
    assert all(0 <= s < 2**63 for s in seeds)
    assert stream_seed(1, 0) == stream_seed(1, 0)


def test_a_rows_probabilities_have_the_same_bits_in_any_batch() -> None:
    # Batch invariance of the sampler's logits path (DESIGN.md): temperature, top-k, top-p and min-p work row by
    # row, so a seeded request's distribution, like its stream, is the same whatever shares its step.
    vocab, gen = 49152, torch.Generator().manual_seed(0)
    pool = 3 * torch.randn(64, vocab, generator=gen)
    params: list[dict[str, float]] = [
        {"temperature": 0.7},
        {"top_p": 0.9},
        {"temperature": 0.8, "top_k": 40},
        {"temperature": 1.2, "min_p": 0.05},
    ]
    states = [make_state(seed=i, **params[i % 4]) for i in range(64)]
    alone = [Sampler.probabilities(pool[i : i + 1].clone(), [states[i]], [0]) for i in range(64)]
    for m in (2, 3, 17, 64):
        rows = torch.randperm(64, generator=gen)[:m].tolist()
        probs = Sampler.probabilities(pool[rows], [states[i] for i in rows], list(range(m)))
        for j, i in enumerate(rows):
            assert torch.equal(probs[j : j + 1], alone[i]), (m, i)
