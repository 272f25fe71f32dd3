"""The official ``openai`` client against a live server: structured outputs hold on a random-weight model.

The tiny model's weights are random, so anything valid it returns comes from the grammar: JSON schemas through
``response_format`` (whole and streamed, greedy and sampled, validated with ``jsonschema``), regex and choice
through the ``guided_*`` fields, and ``tool_choice`` named and required. The schemas bound every string and array:
an unbounded one would let a random model write until ``max_tokens``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from .serve_helpers import MODEL_NAME, MODES, ServerThread, serve

NAME = {"type": "string", "maxLength": 12}
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["person", "ok"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2, "maxItems": 4}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "ranges": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "count": {"type": "integer", "minimum": 10, "maximum": 20},
            "note": NAME,
        },
        "required": ["score", "count"],
        "additionalProperties": False,
    },
    "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 5},
}
MESSAGES = [{"role": "user", "content": "Answer in JSON."}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS["nested"]}},
    {"type": "function", "function": {"name": "pick", "parameters": SCHEMAS["array"]}},
]


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest, loaded: Any) -> Iterator[ServerThread]:
    with serve(loaded, mode=request.param) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _format(name: str) -> Any:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_whole_and_streamed(client: OpenAI, name: str) -> None:
    for temperature in (0.0, 1.0):
        args: dict[str, Any] = {
            "model": MODEL_NAME,
            "messages": MESSAGES,
            "max_tokens": 200,
            "temperature": temperature,
            "seed": 3,
            "response_format": _format(name),
        }
        whole = client.chat.completions.create(n=2, **args)
        for choice in whole.choices:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content or ""), SCHEMAS[name])
        chunks = list(client.chat.completions.create(stream=True, **args))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        if temperature == 0.0:
            assert text == whole.choices[0].message.content


def test_regex_and_choice_through_the_guided_fields(client: OpenAI) -> None:
    r = client.completions.create(
        model=MODEL_NAME, prompt="A code:", max_tokens=30, extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2,4}"}
    )
    assert re.fullmatch("[A-Z]{3}-[0-9]{2,4}", r.choices[0].text), r.choices[0].text
    choices = ["yes", "no", "maybe later"]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=10, n=3, temperature=1.0, extra_body={"guided_choice": choices}
    )
    assert all(c.message.content in choices for c in chat.choices)


def test_the_structured_outputs_field(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=300,
        temperature=0,
        extra_body={"structured_outputs": {"json": SCHEMAS["list"]}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMAS["list"])


def test_tool_choice_named(client: OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=200
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["nested"])


def test_tool_choice_required_whole_and_streamed(client: OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 300,
        "temperature": 1.0,
        "seed": 5,
    }
    r = client.chat.completions.create(**args)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    streamed: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(stream=True, **args):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = streamed.setdefault(tc.index, ["", ""])
            entry[0] += (tc.function.name or "") if tc.function else ""
            entry[1] += (tc.function.arguments or "") if tc.function else ""
    got = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [tuple(streamed[i]) for i in sorted(streamed)] == got  # same seed: the same calls


def test_an_invalid_schema_is_a_400_naming_the_field(client: OpenAI) -> None:
    bad: Any = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nope"}}}
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, response_format=bad)
    assert info.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
