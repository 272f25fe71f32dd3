"""SamplingParams: defaults, normalisation and one refusal per invalid field."""

from __future__ import annotations

import dataclasses

import pytest

from paged_core.errors import RequestRejectedError
from paged_core.sampling import SamplingParams
from paged_core.sampling.params import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS


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


INT64_FIELDS = ["n", "top_k", "seed", "max_tokens", "min_tokens"]


@pytest.mark.parametrize("field", INT64_FIELDS)
@pytest.mark.parametrize("value", [2**63, 2**70, -(2**63) - 1])
def test_ints_beyond_int64_are_refused_naming_the_bound(field: str, value: int) -> None:
    kwargs: dict[str, object] = {field: value}
    if field == "min_tokens" and value > 0:
        kwargs["max_tokens"] = 2**63 - 1  # so the int64 bound, not max_tokens, is what refuses it
    with pytest.raises(RequestRejectedError) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"SamplingParams.{field} must be" in message and "2**63 - 1" in message and str(value) in message


def test_int64_bounds_themselves_are_accepted() -> None:
    top = 2**63 - 1
    p = SamplingParams(n=1, top_k=top, seed=top, max_tokens=top, min_tokens=top, stop_token_ids=[top])
    assert (p.top_k, p.seed, p.max_tokens, p.min_tokens, p.stop_token_ids) == (top, top, top, top, (top,))
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


@pytest.mark.parametrize("ids", [[9223372036854775808], [1, 2**70]])
def test_stop_token_ids_beyond_int64_are_refused(ids: list[int]) -> None:
    with pytest.raises(RequestRejectedError, match=r"SamplingParams\.stop_token_ids must be .*\[0, 2\*\*63 - 1\]"):
        SamplingParams(stop_token_ids=ids, min_tokens=1)


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty", "frequency_penalty"])
def test_numbers_too_large_for_a_float_are_refused(field: str) -> None:
    with pytest.raises(RequestRejectedError, match=rf"SamplingParams\.{field} must be"):
        SamplingParams(**{field: 10**400})  # type: ignore[arg-type]


def test_float_fields_are_stored_as_floats() -> None:
    p = SamplingParams(temperature=2, top_p=1, min_p=0, repetition_penalty=1, frequency_penalty=-2, presence_penalty=2)
    values = (p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
    assert all(type(v) is float for v in values) and values == (2.0, 1.0, 0.0, 1.0, -2.0, 2.0)


def test_stop_string_count_is_capped() -> None:
    assert len(SamplingParams(stop=["s"] * MAX_STOP_STRINGS).stop_strings) == MAX_STOP_STRINGS
    with pytest.raises(RequestRejectedError) as info:
        SamplingParams(stop=["s"] * 100_000)
    message = str(info.value)
    assert message == f"SamplingParams.stop must be at most {MAX_STOP_STRINGS} strings (MAX_STOP_STRINGS); got 100000"


def test_stop_string_characters_are_capped_in_total() -> None:
    half = "x" * (MAX_STOP_CHARS // 2)
    assert SamplingParams(stop=[half, half]).stop_strings == (half, half)
    with pytest.raises(RequestRejectedError, match=rf"at most {MAX_STOP_CHARS} characters in all .*got 4097$"):
        SamplingParams(stop=[half, half + "y"])
    with pytest.raises(RequestRejectedError, match=r"SamplingParams\.stop must be at most 4096 characters"):
        SamplingParams(stop="z" * (MAX_STOP_CHARS + 1))


def test_stop_token_id_count_is_capped() -> None:
    assert len(SamplingParams(stop_token_ids=[1] * MAX_STOP_TOKEN_IDS).stop_token_ids) == MAX_STOP_TOKEN_IDS  # type: ignore[arg-type]
    with pytest.raises(RequestRejectedError, match=rf"at most {MAX_STOP_TOKEN_IDS} ids \(MAX_STOP_TOKEN_IDS\)"):
        SamplingParams(stop_token_ids=[1] * (MAX_STOP_TOKEN_IDS + 1))


def test_huge_values_are_not_echoed_in_full() -> None:
    with pytest.raises(RequestRejectedError) as info:
        SamplingParams(stop=["ok", 7, *["x" * 1000] * 10])  # type: ignore[list-item]
    assert len(str(info.value)) < 400 and "characters)" in str(info.value)


def test_for_vocabulary_checks_stop_ids_and_clamps_top_k() -> None:
    p = SamplingParams(top_k=50, stop_token_ids=[3, 99])
    assert p.for_vocabulary(100) is p
    assert SamplingParams(top_k=2**63 - 1).for_vocabulary(100).top_k == 100
    assert SamplingParams(top_k=101, stop="s").for_vocabulary(100) == SamplingParams(top_k=100, stop="s")
    with pytest.raises(RequestRejectedError) as info:
        SamplingParams(stop_token_ids=[3, 100, 2**63 - 1]).for_vocabulary(100)
    assert str(info.value) == (
        "SamplingParams.stop_token_ids must be token ids in [0, 100) (the vocabulary size); "
        "got [100, 9223372036854775807]"
    )


def test_an_int_too_long_to_print_is_refused_by_name() -> None:
    with pytest.raises(RequestRejectedError, match=r"SamplingParams\.seed must be .*; got <int too large to show>"):
        SamplingParams(seed=10**5000)
