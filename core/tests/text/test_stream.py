"""Detokenizer and stop strings together on the real SmolLM2 tokenizer, one token at a time."""

from __future__ import annotations

from typing import Any

import pytest

from paged_core.text import IncrementalDetokenizer, StopStringChecker

TEXT = "Le café coûte 3€. 日本語もOK 🎉🚀 Fin de la réponse. Après la fin, rien."


def run(tokenizer: Any, stop: tuple[str, ...], include: bool) -> tuple[list[str], list[str], str | None]:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    checker = StopStringChecker(stop, include)
    deltas, shown = [], []
    for token in ids:
        delta = detok.push(token)
        deltas.append(delta)
        emit, matched = checker.feed(delta)
        shown.append(emit)
        if matched is not None:
            return deltas, shown, matched
    shown.append(checker.flush())
    return deltas, shown, None


@pytest.mark.parametrize(
    ("stop", "include", "expected"),
    [
        (("Fin de la",), False, "Le café coûte 3€. 日本語もOK 🎉🚀 "),
        (("Fin de la",), True, "Le café coûte 3€. 日本語もOK 🎉🚀 Fin de la"),
        (("🎉🚀",), False, "Le café coûte 3€. 日本語もOK "),
        (("語も", "coûte"), False, "Le café "),
        (("€. 日",), True, "Le café coûte 3€. 日"),
    ],
)
def test_stop_strings_split_across_token_deltas(
    smollm_tokenizer: Any, stop: tuple[str, ...], include: bool, expected: str
) -> None:
    deltas, shown, matched = run(smollm_tokenizer, stop, include)
    assert matched in stop
    assert "".join(shown) == expected
    # The stop string really spanned several deltas.
    assert not any(matched in d for d in deltas)
    assert not any("\ufffd" in s for s in shown)


def test_without_a_match_everything_comes_out(smollm_tokenizer: Any) -> None:
    _, shown, matched = run(smollm_tokenizer, ("nowhere",), False)
    assert matched is None and "".join(shown) == TEXT
