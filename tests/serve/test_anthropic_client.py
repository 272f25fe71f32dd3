"""The official ``anthropic`` client against a live server: messages, streaming, stops, count_tokens, auth, errors,
and tool use: ``any`` and a named ``tool`` (enforced by the grammar, so the random model's input validates against
the tool's schema, whole and streamed) and a round trip whose ``tool_result`` reaches the chat template.

Tool schemas bound every string and array: an unbounded one would let a random model write until ``max_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import pytest
from anthropic import Anthropic

from .serve_helpers import API_KEY, MODEL_NAME, ServerThread, serve
from .test_tool_calls import TOOLS_TEMPLATE

USER = [{"role": "user", "content": "Tell me about paged memory."}]
# This client no longer has parameters for the sampling fields (newer Claude models fix them); the API, and this
# server, still take them, so they go in the body as extras. Greedy, so that runs can be compared.
GREEDY = {"temperature": 0}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
PICK = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}
    },
    "required": ["tags"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Current weather of a city", "input_schema": WEATHER},
    {"name": "pick", "input_schema": PICK},
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}


@pytest.fixture(scope="module")
def server(loaded: Any) -> Iterator[ServerThread]:
    from paged_core.serve import ServeConfig

    with serve(loaded, ServeConfig(served_model_name=MODEL_NAME, api_key=API_KEY)) as s:
        yield s


@pytest.fixture(scope="module")
def tool_client(loaded: Any, tiny_model_dir: Path) -> Iterator[Anthropic]:
    """A server over the same weights whose tokenizer's chat template offers tools and renders tool calls and
    results (a copy: the shared model's tokenizer keeps its own template), with the hermes parser."""
    import dataclasses

    from transformers import AutoTokenizer

    from paged_core.serve import ServeConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOLS_TEMPLATE
    config = ServeConfig(
        served_model_name=MODEL_NAME, api_key=API_KEY, enable_auto_tool_choice=True, tool_call_parser="hermes"
    )
    with serve(dataclasses.replace(loaded, tokenizer=tokenizer), config) as s:
        yield _client(s, api_key=API_KEY)


def _client(server: ServerThread, **auth: Any) -> Anthropic:
    return Anthropic(base_url=server.url, max_retries=0, timeout=60, **auth)


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Anthropic:
    return _client(server, api_key=API_KEY)  # this client sends the key as 'Authorization: Bearer'


def _create(client: Anthropic, **fields: Any) -> anthropic.types.Message:
    sampling = {**GREEDY, **fields.pop("extra_body", {})}
    args: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 8, "messages": USER, **fields}
    return client.messages.create(**args, extra_body=sampling)


def _text(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_text_message(client: Anthropic) -> None:
    m = _create(client, system="You are terse.", metadata={"user_id": "u-1"}, extra_body={"top_p": 0.9, "top_k": 20})
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == MODEL_NAME
    assert [b.type for b in m.content] == ["text"] and _text(m)
    assert (m.stop_reason, m.stop_sequence) == ("max_tokens", None)
    assert m.usage.output_tokens == 8 and m.usage.input_tokens > 0


def test_streams_match_the_whole_message(client: Anthropic) -> None:
    whole = _create(client)
    args: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 8, "messages": USER, "extra_body": GREEDY}
    with client.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == _text(whole) == _text(final)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.usage.input_tokens == whole.usage.input_tokens
    events = list(client.messages.create(stream=True, **args))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    delta = events[-2]
    assert delta.type == "message_delta" and delta.delta.stop_reason == "max_tokens" and delta.usage.output_tokens == 8


def test_system_prompt_as_text_or_blocks(client: Anthropic) -> None:
    short = _create(client, max_tokens=1, system="You answer in verse.").usage.input_tokens
    blocks = [{"type": "text", "text": "You answer in verse."}]
    assert _create(client, max_tokens=1, system=blocks).usage.input_tokens == short
    longer = _create(client, max_tokens=1, system="You answer in verse, and in rhyme, and briefly.")
    assert longer.usage.input_tokens > short


def test_stop_sequence(client: Anthropic) -> None:
    full = _text(_create(client, max_tokens=12))
    stop = full.strip()[len(full.strip()) // 2 :][:3]
    assert stop, full
    cut = _create(client, max_tokens=12, stop_sequences=[stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert _text(cut) == full[: full.index(stop)]
    with client.messages.stream(
        model=MODEL_NAME, max_tokens=12, messages=USER, extra_body=GREEDY, stop_sequences=[stop]
    ) as stream:
        assert "".join(stream.text_stream) == _text(cut)
        assert stream.get_final_message().stop_sequence == stop


def test_count_tokens_is_the_input_of_the_message(client: Anthropic) -> None:
    system = "Be brief."
    counted = client.messages.count_tokens(model=MODEL_NAME, system=system, messages=USER)
    assert counted.input_tokens == _create(client, system=system, max_tokens=1).usage.input_tokens


def test_prefilled_assistant_turn_is_continued(client: Anthropic, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    messages = [*USER, {"role": "assistant", "content": "Paged memory is"}]
    m = _create(client, messages=messages, max_tokens=4)
    assert m.stop_reason == "max_tokens" and _text(m)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    open_turn = tok.apply_chat_template(messages, continue_final_message=True, tokenize=True, return_dict=False)
    assert (
        m.usage.input_tokens
        == len(open_turn)
        == client.messages.count_tokens(model=MODEL_NAME, messages=messages).input_tokens
    )


def test_api_key_headers(server: ServerThread) -> None:
    by_header = _client(server, api_key=None, default_headers={"x-api-key": API_KEY})
    assert _create(by_header, max_tokens=1).stop_reason == "max_tokens"
    wrong = _client(server, api_key=None, default_headers={"x-api-key": "wrong"})
    with pytest.raises(anthropic.AuthenticationError) as info:
        _create(wrong, max_tokens=1)
    assert info.value.status_code == 401 and info.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        _create(_client(server, api_key="wrong"), max_tokens=1)


@pytest.mark.parametrize(
    ("fields", "error", "kind", "words"),
    [
        ({"max_tokens": 0}, anthropic.BadRequestError, "invalid_request_error", "max_tokens"),
        ({"extra_body": {"temperature": -1.0}}, anthropic.BadRequestError, "invalid_request_error", "temperature"),
        ({"stop_sequences": [""]}, anthropic.BadRequestError, "invalid_request_error", "stop_sequences"),
        ({"max_tokens": 10**6}, anthropic.BadRequestError, "invalid_request_error", "max_tokens"),
        ({"model": "no-such-model"}, anthropic.NotFoundError, "not_found_error", "no-such-model"),
        (
            {"tools": [{"name": "f", "input_schema": {"type": "object"}}]},
            anthropic.BadRequestError,
            "invalid_request_error",
            "--enable-auto-tool-choice",  # tools without tool_choice mean "auto", which this server does not run
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
            anthropic.BadRequestError,
            "invalid_request_error",
            "tool_choice.name names the tool 'nope'",
        ),
        (
            {"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}]}
            | {"tool_choice": {"type": "tool", "name": "f"}},
            anthropic.BadRequestError,
            "invalid_request_error",
            "tools.0.input_schema",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            anthropic.BadRequestError,
            "invalid_request_error",
            "messages.0.content.0.type",
        ),
    ],
)
def test_errors(client: Anthropic, fields: dict[str, Any], error: type[Exception], kind: str, words: str) -> None:
    with pytest.raises(error) as info:
        _create(client, **fields)
    body = info.value.body  # type: ignore[attr-defined]
    assert body["type"] == "error" and body["error"]["type"] == kind and words in body["error"]["message"], body


def _tool_uses(message: Any) -> list[Any]:
    return [b for b in message.content if b.type == "tool_use"]


@pytest.mark.parametrize(
    "choice",
    [{"type": "tool", "name": "pick"}, {"type": "any", "disable_parallel_tool_use": True}],
    ids=["tool", "any"],
)
def test_forced_tool_use_whole_and_streamed(tool_client: Anthropic, choice: dict[str, Any]) -> None:
    args: dict[str, Any] = {"max_tokens": 200, "tools": TOOLS, "tool_choice": choice}
    whole = _create(tool_client, **args)
    assert whole.stop_reason == "tool_use" and [b.type for b in whole.content] == ["tool_use"]
    (call,) = _tool_uses(whole)
    assert call.id.startswith("toolu_") and call.name in SCHEMAS
    assert choice["type"] == "any" or call.name == choice["name"]
    jsonschema.validate(call.input, SCHEMAS[call.name])
    stream_args = {"model": MODEL_NAME, "messages": USER, "extra_body": GREEDY, **args}
    with tool_client.messages.stream(**stream_args) as stream:
        partial = "".join(e.partial_json for e in stream if e.type == "input_json")
        final = stream.get_final_message()
    (streamed,) = _tool_uses(final)
    assert final.stop_reason == "tool_use" and final.usage == whole.usage
    assert (streamed.name, streamed.input) == (call.name, call.input)  # greedy: the same call, joined from deltas
    assert json.loads(partial) == call.input


def test_tool_use_round_trip(tool_client: Anthropic, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    first = _create(tool_client, max_tokens=200, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"})
    (call,) = _tool_uses(first)
    result = "21 degrees and sunny"
    messages: list[Any] = [
        *USER,
        {"role": "assistant", "content": first.content},  # the client's own blocks, sent back
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": result}]},
    ]
    reply = _create(tool_client, messages=messages, tools=TOOLS, max_tokens=8)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.usage.output_tokens > 0
    # The prompt the server rendered is the template's rendering of the same conversation in OpenAI's form:
    # the call with its input, then the tool's result.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    conversation = [
        *USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.input}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    tools = [
        {"type": "function", "function": {k if k != "input_schema" else "parameters": v for k, v in t.items()}}
        for t in TOOLS
    ]
    kwargs: dict[str, Any] = {"tools": tools, "chat_template": TOOLS_TEMPLATE, "add_generation_prompt": True}
    text = tok.apply_chat_template(conversation, tokenize=False, **kwargs)
    assert f"<tool_response>{result}</tool_response>" in text and json.dumps(call.input, ensure_ascii=False) in text
    expected = tok.apply_chat_template(conversation, tokenize=True, return_dict=False, **kwargs)
    assert reply.usage.input_tokens == len(expected)
    counted = tool_client.messages.count_tokens(model=MODEL_NAME, messages=messages, tools=TOOLS)
    assert counted.input_tokens == len(expected)
    # A longer result is more prompt: the result is in it, not dropped.
    longer = [
        *messages[:2],
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": result + ", light wind"}],
                }
            ],
        },
    ]
    assert tool_client.messages.count_tokens(model=MODEL_NAME, messages=longer, tools=TOOLS).input_tokens > len(
        expected
    )


def test_count_tokens_counts_the_tools(tool_client: Anthropic) -> None:
    bare = tool_client.messages.count_tokens(model=MODEL_NAME, messages=USER).input_tokens
    with_tools = tool_client.messages.count_tokens(model=MODEL_NAME, messages=USER, tools=TOOLS).input_tokens
    one_tool = tool_client.messages.count_tokens(model=MODEL_NAME, messages=USER, tools=TOOLS[:1]).input_tokens
    assert bare < one_tool < with_tools
    m = _create(tool_client, max_tokens=1, tools=TOOLS, tool_choice={"type": "none"})
    assert m.usage.input_tokens == with_tools and m.stop_reason == "max_tokens" and not _tool_uses(m)


def test_auto_on_a_server_with_a_parser(tool_client: Anthropic) -> None:
    # A random model almost never writes a <tool_call>; whatever it writes comes back as blocks the client reads.
    m = _create(tool_client, max_tokens=8, tools=TOOLS, tool_choice={"type": "auto"})
    assert m.stop_reason in ("max_tokens", "end_turn", "tool_use") and m.usage.output_tokens > 0
