"""The capture-size policy."""

from __future__ import annotations

import pytest

from paged_core.api import ConfigError
from paged_core.graph import capture_sizes, padded_size


@pytest.mark.parametrize(
    ("max_size", "expected"),
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (20, [1, 2, 4, 8, 16, 20]),
        (32, [1, 2, 4, 8, 16, 24, 32]),
    ],
)
def test_default_sizes(max_size: int, expected: list[int]) -> None:
    assert capture_sizes(max_size) == expected


def test_default_sizes_are_multiples_of_eight_past_eight() -> None:
    sizes = capture_sizes(512)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512
    assert all(s % 8 == 0 for s in sizes[3:]) and len(sizes) == 3 + 512 // 8


def test_explicit_sizes_are_sorted_and_deduplicated() -> None:
    assert capture_sizes(64, [16, 1, 16, 4]) == [1, 4, 16]


@pytest.mark.parametrize(
    ("max_size", "sizes", "message"),
    [
        (0, None, "max_size"),
        (8, [], "empty"),
        (8, [0, 2], "positive"),
        (8, [4, 16], r"exceed max_size=8"),
        (8, [True], "positive"),
    ],
)
def test_bad_sizes_are_named(max_size: int, sizes: list[int] | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        capture_sizes(max_size, sizes)


def test_padded_size_is_smallest_fit_or_none() -> None:
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert padded_size(17, sizes) is None
    with pytest.raises(ConfigError, match="0 tokens"):
        padded_size(0, sizes)
