"""Logprobs: the raw distribution's log_softmax, ranks and top-k alternatives, only where asked."""

from __future__ import annotations

import pytest
import torch

from paged_core.sampling import Sampler, TokenLogprobs

from .helpers import make_state


def test_values_come_from_the_unprocessed_logits() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    states = [
        make_state(logprobs=5, temperature=0.3, top_k=4, repetition_penalty=1.7, prompt=[0, 1, 2]),
        make_state(),
        make_state(logprobs=0, temperature=0),
    ]
    out = Sampler(seed=0).sample(logits, states)
    raw = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[1] is None
    (first,) = out.logprobs[0] or []
    token = out.token_ids[0][0]
    assert first.token_id == token
    assert first.logprob == pytest.approx(raw[0, token].item(), abs=1e-6)
    assert first.rank == int((raw[0] > raw[0, token]).sum()) + 1
    top_values, top_ids = raw[0].topk(5)
    assert [t for t, _ in first.top] == top_ids.tolist()
    assert [v for _, v in first.top] == pytest.approx(top_values.tolist(), abs=1e-6)
    (greedy,) = out.logprobs[2] or []
    assert greedy == TokenLogprobs(out.token_ids[2][0], pytest.approx(raw[2].max().item(), abs=1e-6), 1, ())


def test_low_precision_logits_are_normalised_in_fp32() -> None:
    logits = (torch.randn(2, 64, generator=torch.Generator().manual_seed(1)) * 4).to(torch.bfloat16)
    out = Sampler(seed=0).sample(logits, [make_state(logprobs=3, temperature=0)] * 2)
    raw = torch.log_softmax(logits.float(), dim=-1)
    for row in range(2):
        (entry,) = out.logprobs[row] or []
        assert entry.logprob == pytest.approx(raw[row].max().item(), abs=1e-6)
        assert len(entry.top) == 3


def test_each_of_several_samples_gets_its_own_entry() -> None:
    logits = torch.zeros(1, 1000)
    logits[0, :4] = 5.0
    out = Sampler(seed=2).sample(logits, [make_state(logprobs=2, seed=9)], [4])
    entries = out.logprobs[0] or []
    assert [e.token_id for e in entries] == out.token_ids[0]
    raw = torch.log_softmax(logits[0], dim=-1)
    for entry in entries:
        assert entry.logprob == pytest.approx(raw[entry.token_id].item(), abs=1e-6)
        assert len(entry.top) == 2


def test_top_is_capped_by_the_vocabulary() -> None:
    out = Sampler().sample(torch.tensor([[0.0, 1.0, 2.0]]), [make_state(logprobs=20, temperature=0)])
    (entry,) = out.logprobs[0] or []
    assert [t for t, _ in entry.top] == [2, 1, 0]
    assert sum(torch.tensor([v for _, v in entry.top]).exp().tolist()) == pytest.approx(1.0)


def test_no_row_asking_means_no_logprobs() -> None:
    out = Sampler().sample(torch.randn(2, 5), [make_state(), make_state(temperature=0)])
    assert out.logprobs == [None, None]
