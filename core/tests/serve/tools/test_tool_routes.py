"""``tools`` on /v1/chat/completions over a scripted fake engine: refusals naming the field, parsed calls whole and
streamed, and the tools and tool messages reaching the chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from paged_core.errors import ConfigError
from paged_core.serve import ServeConfig, build_app

from .scripted_engine import ScriptedEngine

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCRIPT = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "weather?"}], "tools": [TOOL]}
AUTO = ServeConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")


def _client(engine: ScriptedEngine, config: ServeConfig) -> Iterator[TestClient]:
    with TestClient(build_app(engine, config)) as c:
        yield c


@pytest.fixture
def scripted() -> ScriptedEngine:
    return ScriptedEngine(SCRIPT)


@pytest.fixture
def auto(scripted: ScriptedEngine) -> Iterator[TestClient]:
    yield from _client(scripted, AUTO)


@pytest.fixture
def plain(scripted: ScriptedEngine) -> Iterator[TestClient]:
    yield from _client(scripted, ServeConfig())


def _error(r: Any, param: str) -> str:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    return str(error["message"])


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"tools": [{"type": "retrieval", "function": TOOL["function"]}]}, "tools.0.type", "function"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "pattern"),
        ({"tools": [TOOL, TOOL]}, "tools", "more than once"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
        ({"tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        ({"tools": None, "tool_choice": "auto"}, "tool_choice", "needs tools"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "bool"),
    ],
)
def test_bad_tool_fields_are_400s_naming_the_field(
    auto: TestClient, change: dict[str, Any], param: str, says: str
) -> None:
    assert says in _error(auto.post("/v1/chat/completions", json={**CHAT, **change}), param)


def test_auto_needs_the_server_flags(plain: TestClient) -> None:
    for body in (CHAT, {**CHAT, "tool_choice": "auto"}):
        assert "--enable-auto-tool-choice" in _error(plain.post("/v1/chat/completions", json=body), "tool_choice")


def test_tool_choice_none_shows_the_tools_and_parses_nothing(plain: TestClient, scripted: ScriptedEngine) -> None:
    body = plain.post("/v1/chat/completions", json={**CHAT, "tool_choice": "none"}).json()
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": SCRIPT} and choice["finish_reason"] == "stop"
    assert scripted.prompts[-1].startswith("tools:" + json.dumps([TOOL], sort_keys=True))


def test_auto_returns_tool_calls(auto: TestClient) -> None:
    choice = auto.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Checking.\n"
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_auto_without_a_call_is_plain_content(scripted: ScriptedEngine, auto: TestClient) -> None:
    scripted.script = "No tools needed."
    choice = auto.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "No tools needed."}
    assert choice["finish_reason"] == "stop"


def test_a_call_cut_by_max_tokens_is_content_with_finish_reason_length(auto: TestClient) -> None:
    choice = auto.post("/v1/chat/completions", json={**CHAT, "max_tokens": 30}).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": SCRIPT[:30]} and choice["finish_reason"] == "length"


def test_parallel_tool_calls_false_keeps_the_first(scripted: ScriptedEngine, auto: TestClient) -> None:
    scripted.script = SCRIPT + SCRIPT.replace("Paris", "Rome")
    body = {**CHAT, "parallel_tool_calls": False}
    (call,) = auto.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["tool_calls"]
    assert "Paris" in call["function"]["arguments"]
    deltas = [c["choices"][0]["delta"] for c in _chunks(auto, body)]
    assert {tc["index"] for d in deltas for tc in d.get("tool_calls", ())} == {0}


def _chunks(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_streamed_tool_calls_in_openai_shape(auto: TestClient) -> None:
    chunks = _chunks(auto, {**CHAT, "n": 2})
    for index in (0, 1):
        choices = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        deltas = [c["delta"] for c in choices]
        assert deltas[0] == {"role": "assistant", "content": ""}
        content = "".join(d.get("content") or "" for d in deltas)
        calls = [tc for d in deltas for tc in d.get("tool_calls", ())]
        assert content == "Checking.\n"
        header, *rest = calls
        assert header["index"] == 0 and header["id"].startswith("call_") and header["type"] == "function"
        assert header["function"] == {"name": "get_weather", "arguments": ""}
        assert "".join(tc["function"]["arguments"] for tc in rest) == '{"city": "Paris"}'
        assert all(set(tc) == {"index", "function"} for tc in rest)
        assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["tool_calls"]
        assert all("tool_calls" not in d for d in deltas[: deltas.index(next(d for d in deltas if "tool_calls" in d))])


def test_tool_round_trip_reaches_the_template(auto: TestClient, scripted: ScriptedEngine) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    scripted.script = "It is sunny."
    r = auto.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert r.json()["choices"][0]["message"]["content"] == "It is sunny."
    turns = scripted.prompts[-1].split("|")
    assert json.loads(turns[2]) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    }
    assert json.loads(turns[3]) == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1]"}}]},
        {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
    ],
)
def test_bad_tool_messages_are_400s(auto: TestClient, message: dict[str, Any]) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "hi"}, message]}
    _error(auto.post("/v1/chat/completions", json=body), "messages")


def test_server_settings_refuse_unknown_parsers_and_auto_without_one() -> None:
    with pytest.raises(ConfigError, match="unknown tool-call parser 'nope'; known: hermes, llama3_json"):
        ServeConfig(tool_call_parser="nope")
    with pytest.raises(ConfigError, match="tool_call_parser"):
        ServeConfig(enable_auto_tool_choice=True)
