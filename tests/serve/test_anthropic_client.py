"""The official ``anthropic`` client against a live server: messages, streaming, stops, count_tokens, auth, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic import Anthropic

from .serve_helpers import API_KEY, MODEL_NAME, ServerThread, serve

USER = [{"role": "user", "content": "Tell me about paged memory."}]
# This client no longer has parameters for the sampling fields (newer Claude models fix them); the API, and this
# server, still take them, so they go in the body as extras. Greedy, so that runs can be compared.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(loaded: Any) -> Iterator[ServerThread]:
    from paged_core.serve import ServeConfig

    with serve(loaded, ServeConfig(served_model_name=MODEL_NAME, api_key=API_KEY)) as s:
        yield s


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
            "tools are not supported yet",
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
