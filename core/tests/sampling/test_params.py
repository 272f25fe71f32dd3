"""SamplingParams: defaults, normalisation and one refusal per invalid field."""

from __future__ import annotations

import dataclasses

import pytest

from paged_core.errors import RequestRejectedError
from paged_core.sampling import SamplingParams


def test_defaults_are_vllm_compatible() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_k, p.top_p, p.min_p) == (1, 1.0, 0, 1.0, 0.0)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty) == (1.0, 0.0, 0.0)
    assert (p.seed, p.stop, p.stop_token_ids, p.max_tokens, p.min_tokens) == (None, (), (), 16, 0)
    assert (p.ignore_eos, p.logprobs, p.include_stop_str_in_output, p.skip_special_tokens) == (False, None, False, True)
    assert not p.is_greedy and not p.has_penalties


@pytest.mark.parametrize(
    ("kwargs", "greedy"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"temperature": 1e-7}, True),
        ({"temperature": 0.01}, False),
    ],
)
def test_is_greedy(kwargs: dict[str, float], greedy: bool) -> None:
    assert SamplingParams(**kwargs).is_greedy is greedy  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, ()), ("x", ("x",)), (["a", "bc"], ("a", "bc")), (("a",), ("a",)), ([], ())],
)
def test_stop_is_normalised_to_a_tuple(stop: object, expected: tuple[str, ...]) -> None:
    p = SamplingParams(stop=stop)  # type: ignore[arg-type]
    assert p.stop == expected and p.stop_strings == expected


def test_stop_token_ids_normalised_and_replace_revalidates() -> None:
    p = SamplingParams(stop_token_ids=[5, 7], stop="s")
    assert p.stop_token_ids == (5, 7)
    q = dataclasses.replace(p, temperature=0.5)
    assert q.stop == ("s",) and q.stop_token_ids == (5, 7) and q.temperature == 0.5
    with pytest.raises(RequestRejectedError, match="top_p"):
        dataclasses.replace(p, top_p=0)


def test_penalties_flag() -> None:
    assert SamplingParams(repetition_penalty=1.1).has_penalties
    assert SamplingParams(frequency_penalty=-0.5).has_penalties
    assert SamplingParams(presence_penalty=2).has_penalties


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().n = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("n", 1.5),
        ("n", True),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "1"),
        ("top_k", -2),
        ("top_k", 2.0),
        ("top_p", 0),
        ("top_p", 1.01),
        ("top_p", -0.5),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1.0),
        ("frequency_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("presence_penalty", 3),
        ("presence_penalty", None),
        ("seed", 1.0),
        ("seed", "7"),
        ("seed", False),
        ("stop", ""),
        ("stop", ["ok", ""]),
        ("stop", [1]),
        ("stop", 5),
        ("stop", {"a"}),
        ("stop_token_ids", [1, -1]),
        ("stop_token_ids", [1.0]),
        ("stop_token_ids", 3),
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("max_tokens", None),
        ("min_tokens", -1),
        ("logprobs", -1),
        ("logprobs", 21),
        ("logprobs", 2.0),
        ("ignore_eos", 1),
        ("include_stop_str_in_output", "yes"),
        ("skip_special_tokens", None),
    ],
)
def test_each_invalid_field_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(RequestRejectedError) as info:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    message = str(info.value)
    assert f"SamplingParams.{field}" in message
    assert repr(value) in message
    assert "must be" in message


def test_min_tokens_above_max_tokens_is_refused() -> None:
    with pytest.raises(RequestRejectedError, match=r"min_tokens must be <= max_tokens \(4\); got 5"):
        SamplingParams(max_tokens=4, min_tokens=5)


@pytest.mark.parametrize("top_k", [0, -1, 1, 50])
def test_valid_top_k(top_k: int) -> None:
    assert SamplingParams(top_k=top_k).top_k == top_k


def test_boundaries_are_accepted() -> None:
    p = SamplingParams(
        top_p=1.0, min_p=1.0, frequency_penalty=-2, presence_penalty=2, logprobs=20, seed=-3, min_tokens=16
    )
    assert p.logprobs == 20 and p.seed == -3
    assert SamplingParams(logprobs=0).logprobs == 0
