"""Tool use on ``/v1/messages`` over a scripted fake engine, through the official ``anthropic`` client: ``auto`` with
the hermes parser (whole, streamed, and a tool_result round trip reaching the template), ``none``, the server flags
``auto`` needs, count_tokens with tools, and refusals in Anthropic's error shape naming the field.

The engine writes a fixed hermes answer, so the parse path is exercised exactly; the grammar-forced choices
(``any``, ``tool``) run against a real model in ``tests/serve/test_anthropic_client.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from fastapi.testclient import TestClient

from paged_core.serve import ServeConfig, build_app

from .tools.scripted_engine import ScriptedEngine

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"name": "get_weather", "description": "Weather of a city", "input_schema": SCHEMA}
SCRIPT = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
USER = [{"role": "user", "content": "weather?"}]
AUTO = ServeConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(SCRIPT)


def _client(engine: ScriptedEngine, config: ServeConfig) -> Iterator[anthropic.Anthropic]:
    with TestClient(build_app(engine, config)) as http:
        yield anthropic.Anthropic(base_url=str(http.base_url), api_key="unused", http_client=http, max_retries=0)


@pytest.fixture
def auto(engine: ScriptedEngine) -> Iterator[anthropic.Anthropic]:
    yield from _client(engine, AUTO)


@pytest.fixture
def plain(engine: ScriptedEngine) -> Iterator[anthropic.Anthropic]:
    yield from _client(engine, ServeConfig())


def _ask(client: anthropic.Anthropic, **fields: Any) -> Any:
    args: dict[str, Any] = {"model": "fake", "max_tokens": 200, "messages": USER, "tools": [TOOL], **fields}
    return client.messages.create(**args)


def _without_ids(blocks: list[Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in blocks]


def test_auto_calls_whole_and_streamed(auto: anthropic.Anthropic, engine: ScriptedEngine) -> None:
    m = _ask(auto)
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["text", "tool_use"]
    text, call = m.content
    assert text.text == "Checking.\n"
    assert call.id.startswith("toolu_") and (call.name, call.input) == ("get_weather", {"city": "Paris"})
    tools = json.loads(engine.prompts[-1].split("|")[0].removeprefix("tools:"))
    assert tools == [
        {
            "type": "function",
            "function": {**{k: v for k, v in TOOL.items() if k != "input_schema"}, "parameters": SCHEMA},
        }
    ]

    args: dict[str, Any] = {"model": "fake", "max_tokens": 200, "messages": USER, "tools": [TOOL]}
    with auto.messages.stream(**args) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and _without_ids(final.content) == _without_ids(m.content)
    assert final.content[1].id.startswith("toolu_") and final.usage == m.usage
    assert kinds.count("input_json") >= 1 and kinds[-1] == "message_stop"


def test_a_tool_result_round_trip_reaches_the_template(auto: anthropic.Anthropic, engine: ScriptedEngine) -> None:
    first = _ask(auto)
    call = first.content[1]
    messages = [
        *USER,
        {"role": "assistant", "content": first.content},  # the client's own objects, sent back as they are
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "21 C and sunny", "is_error": False}
            ],
        },
    ]
    second = _ask(auto, messages=messages)
    assert second.stop_reason == "tool_use"
    turns = [json.loads(t) for t in engine.prompts[-1].removesuffix("|assistant:").split("|")[1:]]
    assert turns[1] == {
        "role": "assistant",
        "content": "Checking.\n",
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    }
    assert turns[2] == {"role": "tool", "content": "21 C and sunny", "tool_call_id": call.id}
    counted = auto.messages.count_tokens(model="fake", messages=messages, tools=[TOOL])  # type: ignore[arg-type]
    assert counted.input_tokens == second.usage.input_tokens


def test_none_shows_the_tools_and_parses_nothing(auto: anthropic.Anthropic, engine: ScriptedEngine) -> None:
    m = _ask(auto, tool_choice={"type": "none"})
    assert m.stop_reason == "end_turn" and [(b.type, b.text) for b in m.content] == [("text", SCRIPT)]
    assert engine.prompts[-1].startswith("tools:")


def test_auto_needs_the_server_flags(plain: anthropic.Anthropic) -> None:
    for fields in ({}, {"tool_choice": {"type": "auto"}}):
        with pytest.raises(anthropic.BadRequestError) as info:
            _ask(plain, **fields)
        error = info.value.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith('tool_choice {"type": "auto"}') and "--tool-call-parser" in error["message"]
    assert _ask(plain, tool_choice={"type": "none"}).stop_reason == "end_turn"


def test_count_tokens_counts_the_tools(plain: anthropic.Anthropic) -> None:
    without = plain.messages.count_tokens(model="fake", messages=USER).input_tokens  # type: ignore[arg-type]
    counted = plain.messages.count_tokens(model="fake", messages=USER, tools=[TOOL]).input_tokens  # type: ignore[arg-type, list-item]
    assert counted - without == len(
        "tools:"
        + json.dumps(
            [
                {
                    "function": {**{k: v for k, v in TOOL.items() if k != "input_schema"}, "parameters": SCHEMA},
                    "type": "function",
                }
            ],
            sort_keys=True,
        )
        + "|"
    )
    m = _ask(plain, tool_choice={"type": "none"}, max_tokens=1)
    assert m.usage.input_tokens == counted


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name names the tool 'nope'"),
        ({"tools": [{**TOOL, "name": "bad name!"}]}, "tools.0.name"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools.0.input_schema"),
        ({"tools": [TOOL, TOOL], "tool_choice": {"type": "none"}}, "more than once"),
        ({"tools": [], "tool_choice": {"type": "any"}}, "needs tools"),
    ],
)
def test_bad_tool_fields_are_anthropic_400s(plain: anthropic.Anthropic, fields: dict[str, Any], words: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        _ask(plain, **fields)
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert words in body["error"]["message"], body  # type: ignore[index]
