"""Sampler basics: greedy, fast path, temperature, min_tokens, input checks, purity."""

from __future__ import annotations

import pytest
import torch

from paged_core.sampling import Sampler

from .helpers import assert_frequencies, draw_counts, make_state


def test_greedy_is_argmax_per_row_in_any_float_dtype() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    expected = logits.argmax(dim=-1).tolist()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = logits.to(dtype)
        out = Sampler().sample(x, [make_state(temperature=0) for _ in range(6)])
        assert out.token_ids == [[t] for t in x.float().argmax(dim=-1).tolist()]
    assert Sampler().sample(logits, [make_state(temperature=0)] * 6).token_ids == [[t] for t in expected]


def test_all_greedy_batch_takes_the_single_argmax_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("the all-greedy batch went through the per-row sampling path")

    monkeypatch.setattr(Sampler, "_draw", fail)
    logits = torch.randn(4, 30)
    out = Sampler().sample(logits, [make_state(temperature=0, seed=i) for i in range(4)], [1, 2, 1, 3])
    best = logits.argmax(dim=-1).tolist()
    assert out.token_ids == [[best[0]], [best[1]] * 2, [best[2]], [best[3]] * 3]
    # A penalty or an unmet min_tokens leaves the fast path.
    with pytest.raises(AssertionError, match="per-row"):
        Sampler().sample(logits[:1], [make_state(temperature=0, presence_penalty=0.5)])
    with pytest.raises(AssertionError, match="per-row"):
        Sampler().sample(logits[:1], [make_state(temperature=0, min_tokens=2, eos=[0])])


def test_greedy_rows_inside_a_mixed_batch_are_argmax() -> None:
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(2))
    states = [make_state(temperature=0 if i % 2 == 0 else 1.0, top_k=3) for i in range(5)]
    out = Sampler(seed=0).sample(logits, states)
    best = logits.argmax(dim=-1).tolist()
    for i in (0, 2, 4):
        assert out.token_ids[i] == [best[i]]
    for i in (1, 3):
        assert out.token_ids[i][0] in logits[i].topk(3).indices.tolist()


def test_sampling_matches_softmax_frequencies() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5])
    counts = draw_counts(logits, 20000)
    probs = logits.softmax(-1).tolist()
    assert_frequencies(counts, dict(enumerate(probs)), 20000)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_the_distribution(temperature: float) -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    counts = draw_counts(logits, 20000, seed=3, temperature=temperature)
    probs = (logits / temperature).softmax(-1).tolist()
    assert_frequencies(counts, dict(enumerate(probs)), 20000)


def test_lower_temperature_concentrates_on_the_top_token() -> None:
    logits = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2])
    tops = [draw_counts(logits, 4000, seed=5, temperature=t)[0] for t in (2.0, 1.0, 0.2)]
    assert tops[0] < tops[1] < tops[2]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([[0.0, 10.0, 9.0, 8.0, 1.0]])  # eos=1 and stop id 2 are the favourites
    state = make_state(temperature=0, min_tokens=2, eos=[1], stop_token_ids=[2])
    sampler = Sampler()
    assert sampler.sample(logits, [state]).token_ids == [[3]]
    state.append(3)
    assert sampler.sample(logits, [state]).token_ids == [[3]]
    state.append(3)
    assert sampler.sample(logits, [state]).token_ids == [[1]]


def test_min_tokens_with_ignore_eos_masks_only_stop_ids() -> None:
    logits = torch.tensor([[0.0, 10.0, 9.0, 8.0]])
    state = make_state(temperature=0, min_tokens=1, eos=[1], stop_token_ids=[2], ignore_eos=True)
    assert Sampler().sample(logits, [state]).token_ids == [[1]]
    random_state = make_state(min_tokens=3, eos=[1], stop_token_ids=[2])
    out = Sampler(seed=0).sample(logits, [random_state], [500])
    assert 1 not in out.token_ids[0] and 2 not in out.token_ids[0]


def test_logits_are_never_modified() -> None:
    logits = torch.randn(3, 20)
    before = logits.clone()
    states = [
        make_state(temperature=0, repetition_penalty=1.5, prompt=[1, 2]),
        make_state(temperature=0.7, top_k=5, top_p=0.8, min_p=0.1, presence_penalty=1.0),
        make_state(min_tokens=4, eos=[0, 1, 2]),
    ]
    states[1].append(4)
    Sampler(seed=0).sample(logits, states, [1, 3, 2])
    assert torch.equal(logits, before)


def test_num_samples_shapes() -> None:
    out = Sampler(seed=0).sample(torch.randn(3, 10), [make_state(), make_state(temperature=0), make_state()], [2, 3, 1])
    assert [len(t) for t in out.token_ids] == [2, 3, 1]
    assert out.logprobs == [None, None, None]


def test_vocab_ids_outside_the_logits_are_ignored() -> None:
    # Prompt and EOS ids beyond the logits width (a tokenizer larger than the model head) must not crash.
    state = make_state(prompt=[3, 999], eos=[500], temperature=0, repetition_penalty=2.0, min_tokens=1)
    out = Sampler().sample(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), [state])
    assert out.token_ids == [[2]]  # 3 was penalised (3 / 2 = 1.5 < 2)


@pytest.mark.parametrize(
    ("logits", "states", "num_samples", "error", "match"),
    [
        (torch.randn(4), 1, None, ValueError, "logits must be a floating-point tensor"),
        (torch.ones(2, 3, dtype=torch.int64), 2, None, ValueError, "floating-point"),
        (torch.randn(2, 5), 3, None, ValueError, "3 sampling states for 2 logits rows"),
        (torch.randn(1, 0), 1, None, ValueError, "empty vocabulary"),
        (torch.randn(2, 5), 2, [1], ValueError, "num_samples has 1 entries for 2 rows"),
        (torch.randn(2, 5), 2, [1, 0], ValueError, r"num_samples\[1\] must be an int >= 1, got 0"),
        (torch.randn(2, 5), 2, [1, True], ValueError, r"num_samples\[1\]"),
    ],
)
def test_bad_inputs_are_refused(
    logits: torch.Tensor, states: int, num_samples: list[int] | None, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Sampler().sample(logits, [make_state() for _ in range(states)], num_samples)


def test_non_state_rows_are_refused() -> None:
    with pytest.raises(TypeError, match=r"states\[0\] must be a SamplingState"):
        Sampler().sample(torch.randn(1, 4), [object()])  # type: ignore[list-item]
