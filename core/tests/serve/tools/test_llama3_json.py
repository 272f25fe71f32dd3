"""The ``llama3_json`` parser: JSON calls (after an optional ``<|python_tag|>``), whole and streamed at every cut."""

from __future__ import annotations

import pytest

from paged_core.serve.tools import create_tool_parser

from .stream_checks import check_every_cut, shape

PARSER = create_tool_parser("llama3_json")
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
ARGS = '{"city": "Paris"}'


@pytest.mark.parametrize("text", [CALL, f"<|python_tag|>{CALL}", f"  \n<|python_tag|> {CALL}\n"])
def test_one_call(text: str) -> None:
    assert shape(check_every_cut(PARSER, text)) == (None, [("get_weather", ARGS)])


def test_several_calls_separated_by_semicolons_and_arguments_key() -> None:
    text = f'{CALL}; {{"name": "get_time", "arguments": {{"zone": "CET"}}}};\n{{"name": "ping"}}'
    found = check_every_cut(PARSER, text)
    assert shape(found) == (None, [("get_weather", ARGS), ("get_time", '{"zone": "CET"}'), ("ping", "{}")])


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "parameters": {"city": "Paris"}',  # never closed
        '<|python_tag|>{"name": get_weather}',
        '{"answer": 42} is my reply',  # JSON, but not a call
        "{ this is prose in braces }",
    ],
)
def test_malformed_or_non_call_json_stays_content(text: str) -> None:
    assert shape(check_every_cut(PARSER, text)) == (text, [])


def test_text_not_opening_with_a_call_is_content() -> None:
    for text in ["", "   ", "Sure! " + CALL, "<|python", "<|pyt hon", "<b>hi</b>"]:
        assert shape(check_every_cut(PARSER, text)) == (text, [])


def test_what_follows_the_calls_when_it_is_not_a_call_is_content() -> None:
    found = check_every_cut(PARSER, f"{CALL}; and that is all")
    assert shape(found) == ("; and that is all", [("get_weather", ARGS)])
