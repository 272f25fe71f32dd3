"""verify: greedy rows keep exactly the argmax tokens; sampled rows are distributed as the target (chi-squared)."""

from __future__ import annotations

import math

import pytest
import torch

from paged_core.sampling.params import SamplingParams
from paged_core.sampling.sampler import Sampler
from paged_core.sampling.speculative import verify, verify_isolated
from paged_core.sampling.state import SamplingState

V = 6
TRIALS = 3000


def _state(**kw: object) -> SamplingState:
    return SamplingState(SamplingParams(**kw), [1, 2, 3])  # type: ignore[arg-type]


def chi2_bound(df: int, z: float = 4.0) -> float:
    """Wilson-Hilferty upper quantile of chi-squared with ``df`` degrees of freedom (z = 4: about 3e-5)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` over the categories with positive probability."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "drew a token of probability 0"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def test_greedy_rows_keep_drafts_while_they_are_the_argmax() -> None:
    logits = torch.full((4, V), -5.0)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 5.0
    greedy = _state(temperature=0.0)
    assert verify(Sampler(0), logits, [greedy], [[2, 4, 0]]) == [[2, 4, 1]]  # third draft wrong: argmax there
    assert verify(Sampler(0), logits, [greedy], [[2, 4, 1]]) == [[2, 4, 1, 3]]  # all kept, plus the bonus
    assert verify(Sampler(0), logits[:1], [greedy], [[]]) == [[2]]


@pytest.mark.parametrize("params", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 4}])
@pytest.mark.parametrize("with_q", [False, True], ids=["point-mass", "draft-distribution"])
def test_sampled_tokens_follow_the_target_distribution(params: dict[str, float], with_q: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, V, generator=gen) * 1.5
    state = _state(**params)
    target = Sampler.probabilities(logits, [state] * 3, [0, 1, 2])
    target = target / target.sum(dim=-1, keepdim=True)
    q = torch.softmax(torch.randn(2, V, generator=gen), dim=-1) if with_q else None
    sampler = Sampler(seed=7)
    first = torch.zeros(V)
    second = torch.zeros(V)  # the token after an accepted first draft: conditionally distributed as target[1]
    for _ in range(TRIALS):
        drafts = (
            [int(torch.multinomial(q[0], 1, generator=gen)), int(torch.multinomial(q[1], 1, generator=gen))]
            if q is not None
            else [2, 3]
        )
        out = verify(sampler, logits, [state], [drafts], [q] if q is not None else None)[0]
        assert out[: len(out) - 1] == drafts[: len(out) - 1] and 1 <= len(out) <= 3
        first[out[0]] += 1
        if len(out) >= 2:
            second[out[1]] += 1
    for counts, probs in ((first, target[0]), (second, target[1])):
        stat, df = chi2(counts, probs)
        assert stat < chi2_bound(df), (stat, df, counts.tolist(), probs.tolist())


def test_seeded_rows_repeat_and_do_not_touch_the_shared_stream() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    a = [verify(Sampler(0), logits, [_state(seed=11)], [[1, 2]]) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    state = _state(seed=11)
    runs = [verify(Sampler(0), logits, [state], [[1, 2]])[0] for _ in range(20)]
    assert len({tuple(r) for r in runs}) > 1  # the state's stream advances


def test_bad_inputs_are_refused_and_isolated() -> None:
    logits = torch.zeros(3, V)
    with pytest.raises(ValueError, match=r"logits must be \[3, V\]"):
        verify(Sampler(0), logits[:2], [_state()], [[1, 2]])
    with pytest.raises(ValueError, match="penalties"):
        verify(Sampler(0), logits, [_state(repetition_penalty=1.2)], [[1, 2]])
    out, errors = verify_isolated(
        Sampler(0), torch.zeros(5, V), [_state(), _state(presence_penalty=1.0)], [[1, 2], [3]]
    )
    assert list(errors) == [1] and len(out[0]) >= 1 and out[1] == []
