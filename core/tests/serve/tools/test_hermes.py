"""The ``hermes`` parser: ``<tool_call>`` blocks, whole and streamed at every cut."""

from __future__ import annotations

import json

import pytest

from paged_core.serve.tools import create_tool_parser

from .stream_checks import check_every_cut, shape

PARSER = create_tool_parser("hermes")
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def test_one_call_with_text_before_it() -> None:
    found = check_every_cut(PARSER, "Let me look that up.\n" + WEATHER)
    assert shape(found) == ("Let me look that up.\n", [("get_weather", '{"city": "Paris", "days": 2}')])
    assert found.calls[0].id.startswith("call_") and len(found.calls[0].id) == 29


def test_several_calls_and_whitespace_between_them_is_not_content() -> None:
    second = '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    found = check_every_cut(PARSER, f"\n{WEATHER}\n\n{second}\n")
    assert shape(found) == (None, [("get_weather", '{"city": "Paris", "days": 2}'), ("get_time", '{"zone": "CET"}')])


def test_text_between_and_after_calls_is_content() -> None:
    found = check_every_cut(PARSER, f"A {WEATHER} and then {WEATHER} done")
    assert found.content == "A  and then  done" and len(found.calls) == 2


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "f", "arguments": {"a": 1}',  # unclosed object
        "not json at all",
        '{"arguments": {}}',  # no name
        '{"name": "f", "arguments": [1, 2]}',  # arguments not an object
        '["f"]',
    ],
)
def test_malformed_block_stays_content(body: str) -> None:
    text = f"Hi <tool_call>{body}</tool_call> bye"
    assert shape(check_every_cut(PARSER, text)) == (text, [])


def test_malformed_block_beside_a_good_one() -> None:
    bad = "<tool_call>{oops}</tool_call>"
    found = check_every_cut(PARSER, f"{bad}{WEATHER}")
    assert shape(found) == (bad, [("get_weather", '{"city": "Paris", "days": 2}')])


def test_unterminated_last_block_counts_when_its_json_is_complete() -> None:
    found = check_every_cut(PARSER, '<tool_call>{"name": "f", "parameters": {"x": "é"}}\n')
    assert shape(found) == (None, [("f", '{"x": "é"}')])
    cut = '<tool_call>{"name": "f", "argu'
    assert shape(check_every_cut(PARSER, cut)) == (cut, [])


def test_plain_text_and_marker_lookalikes_are_content_unchanged() -> None:
    for text in ["", "  \n", "a < b and <tool_ca", "<tool_call", "x </tool_call> y", "<tool>call</tool>"]:
        assert shape(check_every_cut(PARSER, text)) == (text, [])


def test_missing_arguments_mean_an_empty_object() -> None:
    found = check_every_cut(PARSER, '<tool_call>{"name": "ping"}</tool_call>')
    assert shape(found) == (None, [("ping", "{}")])
    assert json.loads(found.calls[0].arguments) == {}


def test_openai_shapes() -> None:
    found = PARSER.extract(WEATHER)
    call = found.calls[0].to_openai()
    assert call == {"id": call["id"], "type": "function", "function": found.calls[0].to_openai()["function"]}
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["days"] == 2
    stream = PARSER.stream()
    header, args = (d.call for d in stream.feed(WEATHER))
    assert header is not None and args is not None
    assert header.to_openai() == {
        "index": 0,
        "id": header.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert args.to_openai() == {"index": 0, "function": {"arguments": '{"city": "Paris", "days": 2}'}}
