"""What an agent sends, through the official ``openai`` and ``anthropic`` clients, to a live server (uvicorn, the
real app) on the embedded SmolLM2, started as ``paged serve --chat-template chatml-tools --enable-auto-tool-choice
--tool-call-parser hermes`` starts it.

- 22 JSON schemas (:mod:`agent_schemas`) through ``response_format: json_schema`` (strict), whole and streamed,
  greedy and sampled at temperature 1: every output validates under ``jsonschema``; a greedy stream spells the
  greedy whole answer;
- regex, choice and Lark grammar constraints, through ``structured_outputs`` and the ``guided_*`` fields;
- tool calls: ``required`` and a named function (enforced by the grammar), and ``auto``, where the model itself
  writes a ``<tool_call>`` (a few-shot conversation: this 135M model follows the pattern, not the instruction)
  that the hermes parser returns as ``tool_calls``, whole and streamed, then a round trip with the tool's result;
- 16 concurrent requests, half constrained: the constrained ones validate and the free ones give, token for
  token, what each gives alone (a constraint never changes another request's output);
- the ``anthropic`` client: text, streaming, and a tool-use round trip with the model's own call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest
from anthropic import Anthropic
from openai import OpenAI

from paged_core import LLM
from paged_core.serve import ServeConfig, build_app
from paged_core.serve.chat_template import chat_template_text

from ..serve.serve_helpers import ServerThread
from .agent_schemas import SCHEMAS

MODEL = "smol"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The current weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "pick_colors", "parameters": SCHEMAS["colors_bounded"]}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _asks(city: str) -> list[Any]:
    """A user's question and the assistant's call for it (the few-shot pattern the model then follows)."""
    call = {
        "id": f"call_{city}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }
    return [
        {"role": "user", "content": f"Weather in {city}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]


FEW_SHOT = [*_asks("London"), *_asks("Rome"), {"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(smol_base: LLM) -> Iterator[ServerThread]:
    """The embedded model on its own engine core (shared weights) behind the real app, tools on."""
    core = smol_base.reconfigured(max_num_seqs=32).engine.core
    config = ServeConfig(
        served_model_name=MODEL,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        chat_template=chat_template_text("chatml-tools"),
    )
    with ServerThread(build_app(core, config)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _in_parallel(calls: list[Callable[[], Any]], workers: int = 16) -> list[Any]:
    """Run ``calls`` concurrently (the server batches them), results in order."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda f: f(), calls))


def _ask_schema(client: OpenAI, name: str, temperature: float, stream: bool, seed: int) -> str:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Give me an example '{name.replace('_', ' ')}' as JSON."}],
        "max_tokens": 200,
        "temperature": temperature,
        "seed": seed,
        "response_format": fmt,
    }
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        assert choice.finish_reason == "stop", (name, choice)
        return choice.message.content or ""
    chunks = list(client.chat.completions.create(stream=True, **args))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"], (name, finish)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_every_schema_validates_whole_and_streamed_greedy_and_sampled(client: OpenAI) -> None:
    assert len(SCHEMAS) >= 20
    cases = [
        (name, temperature, stream, seed)
        for seed, name in enumerate(sorted(SCHEMAS))
        for temperature in (0.0, 1.0)
        for stream in (False, True)
    ]
    texts = _in_parallel([lambda c=c: _ask_schema(client, *c) for c in cases])
    greedy: dict[str, dict[bool, str]] = {}
    for (name, temperature, stream, _), text in zip(cases, texts, strict=True):
        try:
            jsonschema.validate(json.loads(text), SCHEMAS[name])
        except (ValueError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"{name} at temperature {temperature} (stream={stream}): {text!r}") from exc
        if temperature == 0.0:
            greedy.setdefault(name, {})[stream] = text
    for name, by_stream in greedy.items():
        assert by_stream[True] == by_stream[False], name


def test_regex_choice_and_grammar(client: OpenAI) -> None:
    date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    lark = 'start: "[" NUM ("," NUM)* "]"\nNUM: /[0-9]{1,3}/\n'
    cities = ["Paris", "London", "Berlin", "Madrid"]

    def chat(extra: dict[str, Any], temperature: float) -> str:
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "The capital of France? Or a date, or a list of numbers."}],
            max_tokens=40,
            temperature=temperature,
            seed=7,
            extra_body=extra,
        )
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        return r.choices[0].message.content or ""

    for temperature in (0.0, 1.0):
        assert re.fullmatch(date, chat({"structured_outputs": {"regex": date}}, temperature))
        assert chat({"guided_choice": cities}, temperature) in cities
        assert re.fullmatch(r"\[[0-9]{1,3}(,[0-9]{1,3})*\]", chat({"guided_grammar": lark}, temperature))
    done = client.completions.create(
        model=MODEL, prompt="The moon landing was on", max_tokens=20, extra_body={"guided_regex": date}
    )
    assert re.fullmatch(date, done.choices[0].text), done.choices[0].text


def test_tool_choice_required_and_named(client: OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "What should I wear in Oslo today?"}]
    named: Any = {"type": "function", "function": {"name": "pick_colors"}}
    for tool_choice in ("required", named):
        for temperature in (0.0, 1.0):
            r = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                tools=TOOLS,
                tool_choice=tool_choice,
                max_tokens=120,
                temperature=temperature,
                seed=1,
            )
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
            for call in choice.message.tool_calls:
                assert call.type == "function"
                if tool_choice == named:
                    assert call.function.name == "pick_colors"
                jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])
    streamed = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=120,
            temperature=0,
            stream=True,
        )
    )
    names = [
        d.function.name
        for c in streamed
        if c.choices
        for d in c.choices[0].delta.tool_calls or ()
        if d.function and d.function.name
    ]
    args = "".join(
        d.function.arguments or ""
        for c in streamed
        if c.choices
        for d in c.choices[0].delta.tool_calls or ()
        if d.function
    )
    assert len(names) >= 1 and streamed[-1].choices[0].finish_reason == "tool_calls"
    assert names[0] in TOOL_SCHEMAS and args.startswith("{")


def test_auto_the_model_calls_a_tool_then_answers_from_its_result(client: OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=FEW_SHOT, tools=TOOLS, max_tokens=60, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id

    streamed = list(
        client.chat.completions.create(
            model=MODEL, messages=FEW_SHOT, tools=TOOLS, max_tokens=60, temperature=0, stream=True
        )
    )
    deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas if d.function)) == {"city": "Paris"}
    assert streamed[-1].choices[0].finish_reason == "tool_calls"

    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 21, "sky": "sunny"})}
    history: Any = [*FEW_SHOT, choice.message.model_dump(exclude_none=True), result]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0
    )
    answer = second.choices[0]
    assert answer.message.tool_calls in (None, []) and answer.message.content
    assert second.usage and first.usage and second.usage.prompt_tokens > first.usage.prompt_tokens + 10


def test_sixteen_concurrent_half_constrained(client: OpenAI) -> None:
    names = sorted(SCHEMAS)[:8]
    free = [
        f"Write one sentence about {topic}."
        for topic in ("cats", "rain", "bread", "ships", "maps", "bees", "tea", "snow")
    ]

    def constrained(i: int) -> str:
        return _ask_schema(client, names[i], 1.0, i % 2 == 1, seed=100 + i)

    def unconstrained(prompt: str) -> str:
        r = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
        )
        return r.choices[0].text

    alone = [unconstrained(p) for p in free]
    calls: list[Callable[[], Any]] = []
    for i in range(8):
        calls += [lambda i=i: constrained(i), lambda i=i: unconstrained(free[i])]
    together = _in_parallel(calls)
    for i in range(8):
        jsonschema.validate(json.loads(together[2 * i]), SCHEMAS[names[i]])
        assert together[2 * i + 1] == alone[i], free[i]


@pytest.fixture(scope="module")
def anthropic_client(server: ServerThread) -> Anthropic:
    return Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def test_anthropic_text_and_stream(anthropic_client: Anthropic) -> None:
    args: Any = {
        "model": MODEL,
        "max_tokens": 24,
        "messages": [{"role": "user", "content": "Name a color."}],
        "extra_body": {"temperature": 0},
    }
    whole = anthropic_client.messages.create(**args)
    assert whole.content[0].type == "text" and whole.content[0].text
    with anthropic_client.messages.stream(**args) as stream:
        assert "".join(stream.text_stream) == whole.content[0].text
        assert stream.get_final_message().stop_reason == whole.stop_reason


def test_anthropic_tool_use_round_trip(anthropic_client: Anthropic) -> None:
    tools: Any = [{"name": "get_weather", "description": "The current weather in a city", "input_schema": WEATHER}]
    shots: list[Any] = []
    for city in ("London", "Rome"):
        shots += [
            {"role": "user", "content": f"Weather in {city}?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"toolu_{city}", "name": "get_weather", "input": {"city": city}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{city}", "content": "12 C, rain"}],
            },
            {"role": "assistant", "content": f"It is 12 C and raining in {city}."},
        ]
    messages = [*shots, {"role": "user", "content": "Weather in Paris?"}]
    first = anthropic_client.messages.create(
        model=MODEL, max_tokens=60, tools=tools, messages=messages, extra_body={"temperature": 0}
    )
    assert first.stop_reason == "tool_use", first
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    with anthropic_client.messages.stream(
        model=MODEL, max_tokens=60, tools=tools, messages=messages, extra_body={"temperature": 0}
    ) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]

    reply = [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C, sunny"}]
    history: Any = [*messages, {"role": "assistant", "content": first.content}, {"role": "user", "content": reply}]
    second = anthropic_client.messages.create(
        model=MODEL, max_tokens=40, tools=tools, messages=history, extra_body={"temperature": 0}
    )
    assert second.stop_reason in ("end_turn", "max_tokens") and second.content[0].type == "text"
    assert second.usage.input_tokens > first.usage.input_tokens + 10
