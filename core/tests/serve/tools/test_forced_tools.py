"""``tool_choice`` ``required`` and named: the schema the output is constrained to, and the calls read back from
scripted constrained outputs, whole and streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from paged_core.serve import ServeConfig, build_app
from paged_core.serve.tools.forced import NamedToolParser, RequiredToolParser
from paged_core.structured import GrammarCompiler, StructuredOutputs

from ..grammar import use_grammar
from ..test_constraint_routes import RecordingEngine
from .stream_checks import check_every_cut, shape

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ARRAY = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'


@pytest.fixture
def engine() -> RecordingEngine:
    return RecordingEngine('{"city": "Paris"}')


@pytest.fixture
def client(engine: RecordingEngine, grammar_compiler: GrammarCompiler) -> Iterator[TestClient]:
    with TestClient(build_app(engine, ServeConfig())) as c:  # no tool flags: the grammar makes the calls
        yield use_grammar(c, grammar_compiler)


def test_named_constrains_to_the_parameters_and_returns_one_call(client: TestClient, engine: RecordingEngine) -> None:
    choice = client.post("/v1/chat/completions", json={**CHAT, "tool_choice": NAMED}).json()["choices"][0]
    assert engine.params[-1].structured_outputs == StructuredOutputs(json=WEATHER)
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_named_without_parameters_is_any_object(client: TestClient, engine: RecordingEngine) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    assert client.post("/v1/chat/completions", json={**CHAT, "tool_choice": named}).status_code == 200
    assert engine.params[-1].structured_outputs == StructuredOutputs(json={"type": "object"})


def _required_schema(engine: RecordingEngine) -> dict[str, Any]:
    spec = engine.params[-1].structured_outputs
    assert spec is not None and spec.schema is not None
    return spec.schema


def test_required_constrains_to_an_array_of_calls(client: TestClient, engine: RecordingEngine) -> None:
    engine.script = ARRAY
    choice = client.post("/v1/chat/completions", json={**CHAT, "tool_choice": "required"}).json()["choices"][0]
    schema = _required_schema(engine)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(json.loads(ARRAY))
    for bad in ([], [{"name": "nope", "parameters": {}}], [{"name": "get_weather", "parameters": {}}]):
        assert not validator.is_valid(bad), bad
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = [c["function"] for c in choice["message"]["tool_calls"]]
    assert calls == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}, {"name": "get_time", "arguments": "{}"}]


def test_required_without_parallel_calls_allows_one(client: TestClient, engine: RecordingEngine) -> None:
    client.post("/v1/chat/completions", json={**CHAT, "tool_choice": "required", "parallel_tool_calls": False})
    assert _required_schema(engine)["maxItems"] == 1


def _chunks(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


@pytest.mark.parametrize(
    ("choice", "script", "expected"),
    [
        (NAMED, '{"city": "Paris"}', [("get_weather", '{"city": "Paris"}')]),
        ("required", ARRAY, [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    ],
)
def test_streamed_forced_calls(
    client: TestClient, engine: RecordingEngine, choice: Any, script: str, expected: list[tuple[str, str]]
) -> None:
    engine.script = script
    chunks = _chunks(client, {**CHAT, "tool_choice": choice, "n": 2})
    for index in (0, 1):
        choices = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        deltas = [c["delta"] for c in choices]
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert not any(d.get("content") for d in deltas)
        calls: dict[int, list[str]] = {}
        for tc in (tc for d in deltas for tc in d.get("tool_calls", ())):
            if "id" in tc:
                assert tc["id"].startswith("call_") and tc["function"]["arguments"] == ""
                calls[tc["index"]] = [tc["function"]["name"], ""]
            else:
                calls[tc["index"]][1] += tc["function"]["arguments"]
        assert [tuple(calls[i]) for i in sorted(calls)] == expected
        assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["tool_calls"]


def test_forced_calls_with_response_format_are_refused(client: TestClient) -> None:
    for choice in ("required", NAMED):
        body = {**CHAT, "tool_choice": choice, "response_format": {"type": "json_object"}}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        assert "response_format and tool_choice" in r.json()["error"]["message"]


def test_a_tool_schema_the_grammar_refuses_names_the_tool(client: TestClient) -> None:
    tools = [TOOLS[1], {"type": "function", "function": {"name": "bad", "parameters": {"type": "nope"}}}]
    named = {"type": "function", "function": {"name": "bad"}}
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": named})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.1.function.parameters", r.text
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


@pytest.mark.parametrize("text", ['{"city": "Paris"}', "", '{"city": "Pa'])
def test_named_parser_streams_as_it_extracts(text: str) -> None:
    found = check_every_cut(NamedToolParser("get_weather"), text)
    assert shape(found) == (None, [("get_weather", text)])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ARRAY, (None, [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")])),
        ('[{"name": "get_time", "parameters": {}}]', (None, [("get_time", "{}")])),
        ('[{"name": "get_time", "parameters": {}}, {"name": "get_w', (', {"name": "get_w', [("get_time", "{}")])),
        ("[", ("[", [])),
        ("no calls", ("no calls", [])),
    ],
)
def test_required_parser_streams_as_it_extracts(text: str, expected: tuple[str | None, list[tuple[str, str]]]) -> None:
    assert shape(check_every_cut(RequiredToolParser(), text)) == expected
