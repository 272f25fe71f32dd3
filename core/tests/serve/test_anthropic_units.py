"""Anthropic's Messages API without a server: the body's conversion to chat turns, stop reasons, the event sequence."""

from __future__ import annotations

import json
from typing import Any

import pytest

from paged_core.frontend.outputs import CompletionOutput
from paged_core.serve.anthropic.convert import content_blocks, convert, stop_reason
from paged_core.serve.anthropic.errors import anthropic_body
from paged_core.serve.anthropic.protocol import MessagesRequest
from paged_core.serve.anthropic.stream import MessageEvents, sse_event
from paged_core.serve.errors import APIError


def _request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    return MessagesRequest.model_validate(body)


def test_system_and_text_blocks_become_chat_turns() -> None:
    req = _request(
        system=[{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Be kind.", "cache_control": {}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
    )
    turns = [(m.role, m.text()) for m in convert(req).chat.messages]
    assert turns == [("system", "Be terse.\nBe kind."), ("user", "a\nb"), ("assistant", "c"), ("user", "d")]


def test_sampling_fields_carry_over_to_the_chat_request() -> None:
    chat = convert(
        _request(stop_sequences=["\n\n"], temperature=0.5, top_p=0.9, top_k=40, stream=True, metadata={"user_id": "u"})
    ).chat
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_p, chat.top_k, chat.stream) == (
        8,
        ["\n\n"],
        0.5,
        0.9,
        40,
        True,
    )
    assert chat.n == 1 and chat.max_completion_tokens is None
    assert (chat.tools, chat.tool_choice, chat.parallel_tool_calls) == (None, None, True)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.type",
            "image content blocks are not supported yet",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
            "messages.0.content.0.input",
            "missing required parameter",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
            "missing required parameter",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
            "messages.0.content.0.extra",
            "unrecognized",
        ),
        ({"system": [{"type": "tool_result"}]}, "system.0.type", "go in user messages, not in the system prompt"),
        ({"system": [{"type": "sticker"}]}, "system.0.type", "expected 'text'"),
        ({"messages": [{"role": "user", "content": [{"type": "sticker"}]}]}, "messages.0.content.0.type", "sticker"),
    ],
)
def test_unsupported_and_malformed_blocks_are_refused_by_name(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(APIError) as info:
        convert(_request(**fields))
    assert info.value.status == 400 and info.value.param == param
    assert words in info.value.message and param in info.value.message


def test_chat_errors_are_renamed_to_the_anthropic_fields() -> None:
    plain = convert(_request(messages=[{"role": "user", "content": "a"}] * 3))
    with_system = convert(_request(system="s", messages=[{"role": "user", "content": "a"}] * 2))
    stop = plain.renamed(APIError(400, "stop must be at most 4 strings", param="stop"))
    assert (stop.param, stop.message) == ("stop_sequences", "stop_sequences must be at most 4 strings")
    content = "messages[0].content contains the control token '<|im_start|>'"
    assert with_system.renamed(APIError(400, content, param="messages")).message.startswith("system contains")
    shifted = with_system.renamed(APIError(400, "messages[2].content contains x", param="messages"))
    assert shifted.message == "messages.1.content contains x"
    assert plain.renamed(APIError(400, "messages[2].content x")).message == "messages.2.content x"
    assert plain.renamed(APIError(400, "x", param="max_completion_tokens")).param == "max_tokens"


@pytest.mark.parametrize(
    ("finish", "reason", "expected"),
    [
        ("length", None, ("max_tokens", None)),
        ("stop", None, ("end_turn", None)),
        ("stop", 2, ("end_turn", None)),  # the end-of-turn token
        ("stop", "###", ("stop_sequence", "###")),
    ],
)
def test_stop_reasons(finish: str, reason: int | str | None, expected: tuple[str, str | None]) -> None:
    assert stop_reason(CompletionOutput(0, finish_reason=finish, stop_reason=reason)) == expected


def test_content_blocks_of_text_and_of_nothing() -> None:
    assert content_blocks("Hi") == [{"type": "text", "text": "Hi"}]
    assert content_blocks("") == []


def test_error_shape_names_the_field_and_maps_the_status() -> None:
    body = anthropic_body(APIError(400, "must be positive", param="max_tokens"))
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: must be positive"},
    }
    kinds = {s: anthropic_body(APIError(s, "x"))["error"]["type"] for s in (401, 404, 413, 429, 500, 503)}
    assert kinds == {
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        503: "overloaded_error",
    }
    assert anthropic_body(APIError(400, "bad max_tokens", param="max_tokens"))["error"]["message"] == "bad max_tokens"


def test_event_sequence_of_a_streamed_message() -> None:
    events = MessageEvents("msg_1", "m", input_tokens=5)
    seq = events.start() + events.text("") + events.text("Hel") + events.text("lo") + events.finish("end_turn", None, 2)
    assert [e["type"] for e in seq] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = seq[0]["message"]
    assert start["id"] == "msg_1" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert seq[2] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [e["delta"]["text"] for e in seq[3:5]] == ["Hel", "lo"]
    assert seq[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert seq[6]["usage"]["output_tokens"] == 2


def test_a_message_without_text_has_no_block() -> None:
    events = MessageEvents("msg_1", "m", input_tokens=5)
    seq = events.start() + events.finish("stop_sequence", "###", 1)
    assert [e["type"] for e in seq] == ["message_start", "ping", "message_delta", "message_stop"]
    assert seq[2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}


def test_sse_event_is_named_after_its_type() -> None:
    text = sse_event({"type": "ping"})
    assert text == 'event: ping\ndata: {"type":"ping"}\n\n'
    _, data = text.strip().split("\n")
    assert json.loads(data.removeprefix("data: ")) == {"type": "ping"}
