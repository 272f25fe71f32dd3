"""StopStringChecker: matches anywhere, across deltas, never leaking a partial stop string."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_core.text import StopStringChecker


def feed_all(checker: StopStringChecker, deltas: list[str]) -> tuple[list[str], str | None]:
    emitted: list[str] = []
    for delta in deltas:
        emit, matched = checker.feed(delta)
        emitted.append(emit)
        if matched is not None:
            return emitted, matched
    emitted.append(checker.flush())
    return emitted, None


def reference(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
    """What a character-by-character stream sees: the stop string that completes first wins."""
    best = None
    for s in stops:
        start = text.find(s)
        if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
            best = (start + len(s), start, s)
    if best is None:
        return text, None
    end, start, s = best
    return text[: end if include else start], s


def test_match_inside_one_delta() -> None:
    checker = StopStringChecker(("STOP",), False)
    assert checker.feed("abc STOP def") == ("abc ", "STOP")
    assert checker.matched == "STOP"
    assert checker.feed("more") == ("", None) and checker.flush() == ""


def test_match_spanning_deltas_is_held_then_cut() -> None:
    checker = StopStringChecker(("</end>",), False)
    assert checker.feed("hello </") == ("hello ", None)
    assert checker.held == "</"
    assert checker.feed("en") == ("", None)
    assert checker.feed("d> trailing") == ("", "</end>")


def test_include_stop_string_in_output() -> None:
    checker = StopStringChecker(("</end>",), True)
    assert checker.feed("a </e") == ("a ", None)
    assert checker.feed("nd> b") == ("</end>", "</end>")


def test_held_text_that_stops_matching_is_released() -> None:
    checker = StopStringChecker(("abc",), False)
    assert checker.feed("xab") == ("x", None)
    assert checker.feed("d") == ("abd", None)
    assert checker.feed("a") == ("", None)
    assert checker.flush() == "a"


def test_hold_back_is_at_most_the_longest_stop_minus_one() -> None:
    checker = StopStringChecker(("aaaa", "b"), False)
    assert checker.feed("xaaa") == ("x", None) and checker.held == "aaa"
    checker = StopStringChecker(("aaaa",), False)
    assert checker.feed("aaa") == ("", None) and checker.feed("b") == ("aaab", None)


def test_first_completed_stop_wins_regardless_of_list_order() -> None:
    assert StopStringChecker(("abcd", "bc"), False).feed("xabcdx") == ("xa", "bc")
    assert StopStringChecker(("bc", "abc"), True).feed("xabcd") == ("xabc", "abc")  # same end: earlier start


def test_no_stops_passes_through() -> None:
    checker = StopStringChecker((), False)
    assert checker.feed("anything") == ("anything", None) and checker.flush() == ""


@pytest.mark.parametrize("bad", [("",), ("ok", ""), (None,)])
def test_empty_or_non_str_stops_are_refused(bad: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="stop strings must be non-empty strs"):
        StopStringChecker(bad, False)  # type: ignore[arg-type]


ALPHABET = "ab🎉é "


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=30),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=10),
    include=st.booleans(),
)
def test_any_chunking_gives_the_character_stream_result(
    text: str, stops: list[str], cuts: list[int], include: bool
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    emitted, matched = feed_all(StopStringChecker(tuple(stops), include), deltas)
    assert ("".join(emitted), matched) == reference(text, tuple(stops), include)
    # Streaming never shows text beyond the final cut: every emission is a prefix of the final output.
    shown = ""
    for piece in emitted:
        shown += piece
        assert reference(text, tuple(stops), include)[0].startswith(shown)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab", max_size=40),
    stops=st.lists(st.text(alphabet="ab", min_size=1, max_size=6), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
    include=st.booleans(),
)
def test_many_overlapping_stops_give_the_character_stream_result(
    text: str, stops: list[str], cuts: list[int], include: bool
) -> None:
    # A two-letter alphabet makes stop strings prefixes and suffixes of one another: the automaton's hard cases.
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    checker = StopStringChecker(tuple(stops), include)
    emitted, matched = feed_all(checker, deltas)
    assert ("".join(emitted), matched) == reference(text, tuple(stops), include)
    assert len(checker.held) <= max(len(s) for s in stops) - 1


def _never_matching_stops(count: int, rng: random.Random) -> tuple[str, ...]:
    """``count`` distinct stop strings whose prefixes keep matching text over "abcd" but which never complete."""
    stops: set[str] = set()
    while len(stops) < count:
        stops.add("".join(rng.choice("abcd") for _ in range(rng.randint(3, 9))) + "e")
    return tuple(sorted(stops))


def test_matching_cost_does_not_grow_with_the_number_of_stop_strings() -> None:
    rng = random.Random(0)
    text = "".join(rng.choice("abcd") for _ in range(3000))
    deltas, i = [], 0
    while i < len(text):
        step = rng.randint(1, 6)
        deltas.append(text[i : i + step])
        i += step
    steps = {}
    for count in (10, 10_000):
        stops = _never_matching_stops(count, rng)
        checker = StopStringChecker(stops)
        emitted, matched = feed_all(checker, deltas)
        assert matched is None and "".join(emitted) == text
        # Aho-Corasick: at most two transitions per character fed, whatever the number of stop strings.
        assert checker.steps <= 2 * len(text)
        steps[count] = checker.steps
    assert steps[10] >= len(text)  # every character costs at least one transition
    # A thousand times more stop strings: deeper partial matches, but the same bound on the work.
    assert steps[10_000] <= 2 * steps[10]


def test_many_stops_find_the_first_completion() -> None:
    rng = random.Random(1)
    stops = _never_matching_stops(10_000, rng)
    target = stops[1234]
    text = "".join(rng.choice("abcd") for _ in range(500)) + target + "dd" + stops[99]
    checker = StopStringChecker(stops)
    emitted, matched = feed_all(checker, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert ("".join(emitted), matched) == reference(text, stops, False)
    # The text's first "e" ends the target: whichever stop matched (the longest ending there) ends there too.
    assert matched is not None and "".join(emitted) + matched == text[: text.index(target) + len(target)]
