"""StopStringChecker: matches anywhere, across deltas, never leaking a partial stop string."""

from __future__ import annotations

import itertools

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
