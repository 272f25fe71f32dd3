"""Anthropic's tool use without a server: tools and tool_choice as chat's, tool_use/tool_result blocks as the chat
template's turns, parsed calls as ``tool_use`` blocks, and the streamed event sequence of a call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from paged_core.frontend.outputs import CompletionOutput
from paged_core.serve.anthropic.convert import content_blocks, convert, stop_reason
from paged_core.serve.anthropic.protocol import MessagesRequest
from paged_core.serve.anthropic.stream import MessageEvents
from paged_core.serve.anthropic.tools import tool_input
from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatCompletionRequest
from paged_core.serve.tools.choices import ChoiceStreams
from paged_core.serve.tools.forced import NamedToolParser, RequiredToolParser
from paged_core.serve.tools.hermes import HermesToolParser
from paged_core.serve.tools.template import template_message

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": SCHEMA}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SECOND = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def _request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    return MessagesRequest.model_validate(body)


def _refused(**fields: Any) -> APIError:
    with pytest.raises(APIError) as info:
        convert(_request(**fields))
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("choice", "chat_choice", "parallel"),
    [
        (None, None, True),
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", True),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, True),
    ],
)
def test_tools_and_tool_choice_become_chat_fields(choice: Any, chat_choice: Any, parallel: bool) -> None:
    chat = convert(_request(tools=TOOLS, tool_choice=choice)).chat
    assert [t.model_dump(exclude_none=True) for t in chat.tools or []] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather of a city", "parameters": SCHEMA},
        }
    ]
    got = chat.tool_choice.model_dump() if hasattr(chat.tool_choice, "model_dump") else chat.tool_choice
    assert got == chat_choice and chat.parallel_tool_calls is parallel


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name", "'nope', which is not in tools"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name", "required"),
        ({"tool_choice": {"type": "any", "name": "get_weather"}}, "tool_choice.name", "only for"),
        ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools.0.input_schema", "of an object"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages.0.content.0.type",
            "tool_use blocks go in assistant messages",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
            "messages.0.content.0.type",
            "tool_result blocks go in user messages",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages.0.content.0.tool_use_id",
            "missing",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}],
                    }
                ]
            },
            "messages.0.content.0.content.0.type",
            "image content blocks",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 1}]}
                ]
            },
            "messages.0.content.0.input",
            "dict",
        ),
    ],
)
def test_bad_tool_fields_are_400s_naming_the_field(fields: dict[str, Any], param: str, words: str) -> None:
    error = _refused(**{"tools": TOOLS, **fields})
    assert error.param == param and words in error.message, error.message


ANTHROPIC_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "3 C"}]},
            {"type": "text", "text": "And tomorrow?"},
        ],
    },
]
OPENAI_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": [{"type": "text", "text": "Checking."}],
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "toolu_2", "content": "3 C"},
    {"role": "user", "content": "And tomorrow?"},
]


def test_tool_use_and_tool_result_reach_the_template_as_the_openai_conversation_does() -> None:
    converted = convert(_request(messages=ANTHROPIC_CONVERSATION, tools=TOOLS, system="sys"))
    openai = ChatCompletionRequest.model_validate({"model": "m", "messages": OPENAI_CONVERSATION})
    got = [template_message(i, m) for i, m in enumerate(converted.chat.messages)]
    expected = [template_message(i, m) for i, m in enumerate(openai.messages)]
    assert got == [{"role": "system", "content": "sys"}, *expected]
    assert got[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert converted.origins == [
        "system",
        "messages.0",
        "messages.1",
        "messages.2.content.0",
        "messages.2.content.1",
        "messages.2",
    ]
    # A chat error about the tool turn names the block the client sent.
    error = converted.renamed(APIError(400, "messages[4].content contains the control token x", param="messages"))
    assert error.message == "messages.2.content.1.content contains the control token x"


def test_chat_errors_name_the_anthropic_tool_fields() -> None:
    converted = convert(_request(tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}))
    schema = converted.renamed(
        APIError(400, "tools.0.function.parameters: unsupported keyword", param="tools.0.function.parameters")
    )
    assert (schema.param, schema.message) == ("tools.0.input_schema", "tools.0.input_schema: unsupported keyword")
    auto = converted.renamed(APIError(400, "send tool_choice 'none' to show the tools only", param="tool_choice"))
    assert auto.message == 'send tool_choice {"type": "none"} to show the tools only'


def test_parsed_calls_become_tool_use_blocks() -> None:
    blocks = content_blocks(f"Let me check.\n{CALL}\n{SECOND}", HermesToolParser())
    assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_use"]
    assert blocks[0]["text"] == "Let me check.\n"
    assert [(b["name"], b["input"]) for b in blocks[1:]] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert all(b["id"].startswith("toolu_") and len(b["id"]) == len("toolu_") + 24 for b in blocks[1:])
    assert blocks[1]["id"] != blocks[2]["id"]
    only_first = content_blocks(f"{CALL}\n{SECOND}", HermesToolParser(), parallel_calls=False)
    assert [(b["type"], b["input"]) for b in only_first] == [("tool_use", {"city": "Paris"})]
    assert content_blocks("no call here", HermesToolParser()) == [{"type": "text", "text": "no call here"}]
    ordered = content_blocks(f"First.\n{CALL}\nThen more.", HermesToolParser())
    assert [(b["type"], b.get("text")) for b in ordered] == [
        ("text", "First.\n"),
        ("tool_use", None),
        ("text", "\nThen more."),
    ]


def test_a_call_cut_short_keeps_the_input_it_has() -> None:
    assert tool_input('{"city": "Paris", "days": [1, 2') == {"city": "Paris", "days": [1, 2]}
    assert tool_input('{"city": "Par') == {}  # an unfinished string is left out, as Anthropic's client does
    assert tool_input("") == {} and tool_input("[1]") == {}
    (block,) = content_blocks('{"city": "Paris", "n": 3', NamedToolParser("get_weather"))
    assert (block["name"], block["input"]) == ("get_weather", {"city": "Paris", "n": 3})
    # Under "any" the calls are an array's elements: one cut short is no call, and comes back as the text it is.
    cut = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_weather", "param'
    assert [(b["type"], b.get("input"), b.get("text")) for b in content_blocks(cut, RequiredToolParser())] == [
        ("tool_use", {"city": "Paris"}, None),
        ("text", None, ', {"name": "get_weather", "param'),
    ]


@pytest.mark.parametrize(
    ("finish", "called", "expected"),
    [("stop", True, ("tool_use", None)), ("length", True, ("max_tokens", None)), ("stop", False, ("end_turn", None))],
)
def test_stop_reason_of_a_call(finish: str, called: bool, expected: tuple[str, None]) -> None:
    assert stop_reason(CompletionOutput(0, finish_reason=finish, stop_reason=None), called) == expected


def _stream(text: str, parser: Any, parallel: bool = True, cut: int = 1) -> tuple[MessageEvents, list[dict[str, Any]]]:
    """The events of ``text`` fed ``cut`` characters at a time through the parser, as the route feeds them."""
    events = MessageEvents("msg_1", "m", input_tokens=5)
    streams = ChoiceStreams(parser, parallel)
    seq = events.start()
    for start in range(0, len(text), cut):
        seq += events.pieces(streams.pieces(0, text[start : start + cut], start + cut >= len(text)))
    return events, seq + events.finish("tool_use", None, 9)


def _joined(seq: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a client builds from the events (JSON input joined, then parsed)."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for e in seq:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            delta = e["delta"]
            if delta["type"] == "text_delta":
                blocks[e["index"]]["text"] += delta["text"]
            else:
                partial[e["index"]] = partial.get(e["index"], "") + delta["partial_json"]
    for i, text in partial.items():
        blocks[i]["input"] = json.loads(text)
    return blocks


@pytest.mark.parametrize("cut", [1, 3, 1000])
@pytest.mark.parametrize("after", ["", "\nDone."])
def test_streamed_calls_are_tool_use_blocks_with_input_json_deltas(cut: int, after: str) -> None:
    text = f"Let me check.\n{CALL}\n{SECOND}{after}"
    events, seq = _stream(text, HermesToolParser(), cut=cut)
    kinds = [e["type"] for e in seq]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-2:] == ["message_delta", "message_stop"] and events.called
    starts = [e for e in seq if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use", "tool_use"] + ["text"] * bool(after)
    assert starts[1]["content_block"]["input"] == {} and starts[1]["content_block"]["id"].startswith("toolu_")
    stops = [e["index"] for e in seq if e["type"] == "content_block_stop"]
    assert stops == list(range(len(starts)))  # each block closes before the next opens, the last before message_delta
    assert kinds.index("content_block_stop") < [i for i, k in enumerate(kinds) if k == "content_block_start"][1]
    deltas = [e["delta"]["type"] for e in seq if e["type"] == "content_block_delta" and e["index"] in (1, 2)]
    assert set(deltas) == {"input_json_delta"}
    whole = content_blocks(text, HermesToolParser())
    strip = [{k: v for k, v in b.items() if k != "id"} for b in whole]
    assert [{k: v for k, v in b.items() if k != "id"} for b in _joined(seq)] == strip


def test_a_named_call_streams_its_input_as_the_model_writes_it() -> None:
    args = '{"city": "Paris"}'
    _, seq = _stream(args, NamedToolParser("get_weather"), cut=2)
    pieces = [e["delta"]["partial_json"] for e in seq if e["type"] == "content_block_delta"]
    assert len(pieces) == len(args) // 2 + len(args) % 2 and "".join(pieces) == args
    assert _joined(seq) == [
        {"type": "tool_use", "id": _joined(seq)[0]["id"], "name": "get_weather", "input": {"city": "Paris"}}
    ]


def test_without_parallel_calls_the_stream_has_one_tool_use() -> None:
    events, seq = _stream(f"{CALL}\n{SECOND}", HermesToolParser(), parallel=False, cut=4)
    assert [b["input"] for b in _joined(seq)] == [{"city": "Paris"}] and events.called


def test_text_without_a_call_streams_as_text_and_is_no_call() -> None:
    events, seq = _stream("Just text <tool", HermesToolParser(), cut=2)
    assert _joined(seq) == [{"type": "text", "text": "Just text <tool"}] and not events.called
