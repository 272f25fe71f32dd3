"""Structured outputs on /v1/completions and /v1/chat/completions: each request field maps to the exact
``SamplingParams.structured_outputs`` the core receives, and each refusal is a 400 naming the request's field."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from paged_core.sampling.params import SamplingParams
from paged_core.serve import ServeConfig, build_app
from paged_core.structured import GrammarCompiler, StructuredOutputs

from .grammar import use_grammar
from .tools.scripted_engine import ScriptedEngine

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
COMPLETION = {"model": "fake", "prompt": "hi", "max_tokens": 40}


class RecordingEngine(ScriptedEngine):
    """A scripted engine that keeps every request's sampling params."""

    def __init__(self, script: str) -> None:
        super().__init__(script)
        self.params: list[SamplingParams] = []

    def add_request(self, request: Any) -> None:
        self.params.append(request.params)
        super().add_request(request)


@pytest.fixture
def engine() -> RecordingEngine:
    return RecordingEngine('{"city": "Paris"}')


@pytest.fixture
def client(engine: RecordingEngine, grammar_compiler: GrammarCompiler) -> Iterator[TestClient]:
    with TestClient(build_app(engine, ServeConfig())) as c:
        yield use_grammar(c, grammar_compiler)


ROUTES = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)]


@pytest.mark.parametrize(("path", "base"), ROUTES)
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, StructuredOutputs(json_object=True)),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}},
            StructuredOutputs(json=SCHEMA),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "c", "description": "d", "strict": True, "schema": SCHEMA},
                }
            },
            StructuredOutputs(json=SCHEMA),
        ),
        ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputs(json=SCHEMA)),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, StructuredOutputs(json=SCHEMA)),
        ({"structured_outputs": {"regex": "[a-z]+"}}, StructuredOutputs(regex="[a-z]+")),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredOutputs(choice=["yes", "no"])),
        ({"structured_outputs": {"grammar": 'start: "a"+'}}, StructuredOutputs(grammar='start: "a"+')),
        ({"structured_outputs": {"json_object": True}}, StructuredOutputs(json_object=True)),
        ({"guided_json": SCHEMA}, StructuredOutputs(json=SCHEMA)),
        ({"guided_regex": "\\d{3}"}, StructuredOutputs(regex="\\d{3}")),
        ({"guided_choice": ["a", "b"]}, StructuredOutputs(choice=["a", "b"])),
        ({"guided_grammar": 'start: "x"'}, StructuredOutputs(grammar='start: "x"')),
        ({"response_format": {"type": "text"}}, None),
        ({}, None),
    ],
)
def test_each_field_maps_to_its_constraint(
    client: TestClient,
    engine: RecordingEngine,
    path: str,
    base: dict[str, Any],
    fields: dict[str, Any],
    expected: StructuredOutputs | None,
) -> None:
    r = client.post(path, json={**base, **fields, "n": 2})
    assert r.status_code == 200, r.text
    assert engine.params[-1].structured_outputs == expected
    assert engine.params[-1].n == 2  # constraints and n > 1 go together


def _error(r: Any, param: str) -> str:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    return str(error["message"])


@pytest.mark.parametrize(("path", "base"), ROUTES)
@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
            "response_format.json_schema.schema: ",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs a json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
        ({"guided_json": {"type": "object", "minProperties": "x"}}, "guided_json", "guided_json: "),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "guided_regex: "),
        ({"structured_outputs": {"regex": "[z-a]"}}, "structured_outputs.regex", "structured_outputs.regex: "),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "guided_grammar: "),
        ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs.grammar", "structured_outputs.grammar"),
        ({"guided_choice": []}, "guided_choice", "1 to 1024"),
        ({"structured_outputs": {}}, "structured_outputs", "none is set"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice", "regex and choice"),
        ({"structured_outputs": {"whitespace": "x"}}, "structured_outputs.whitespace", "unrecognized"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "guided_regex and guided_choice"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "at most one way to constrain the output; got response_format and structured_outputs",
        ),
        ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json", "response_format and"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(
    client: TestClient, path: str, base: dict[str, Any], fields: dict[str, Any], param: str, says: str
) -> None:
    assert says in _error(client.post(path, json={**base, **fields}), param)


def test_beam_search_refuses_a_constraint_by_its_field(client: TestClient) -> None:
    body = {**COMPLETION, "n": 2, "use_beam_search": True}
    assert "use_beam_search" in _error(
        client.post("/v1/completions", json={**body, "guided_regex": "a+"}), "guided_regex"
    )
    rf = {"response_format": {"type": "json_object"}}
    _error(client.post("/v1/completions", json={**body, **rf}), "response_format")


def test_a_timed_out_compile_is_a_400(
    client: TestClient, grammar_compiler: GrammarCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A compile held past the bound (a real one is too quick here to race a timer deterministically).
    slow_compile = grammar_compiler._compile

    def held(spec: Any) -> Any:
        time.sleep(0.5)
        return slow_compile(spec)

    monkeypatch.setattr(grammar_compiler, "timeout_s", 0.05)
    monkeypatch.setattr(grammar_compiler, "_compile", held)
    schema = {"type": "object", "properties": {"k": {"type": "string"}}}
    says = _error(client.post("/v1/chat/completions", json={**CHAT, "guided_json": schema}), "guided_json")
    assert "did not compile within" in says


def test_a_tokenizer_the_grammar_engine_cannot_use_is_a_400(engine: RecordingEngine) -> None:
    with TestClient(build_app(engine, ServeConfig())) as c:  # the fake engine's own character tokenizer
        for _ in range(2):  # the failure is remembered, and said the same way
            says = _error(c.post("/v1/completions", json={**COMPLETION, "guided_regex": "a+"}), "guided_regex")
            assert "structured outputs are not available on this server" in says
