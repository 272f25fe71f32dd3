"""``/v1/messages`` over the fake engine: the body, the event stream, errors in Anthropic's shape, auth headers."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from paged_core.serve import ServeConfig, build_app

from .fake_engine import FakeEngine

BODY = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


def _events(client: TestClient, body: dict[str, Any]) -> list[tuple[str, Any]]:
    with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = []
    for frame in text.strip().split("\n\n"):
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        events.append((payload["type"], payload))
    return events


def _error(r: Any, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def test_message_shape_and_usage(client: TestClient) -> None:
    r = client.post("/v1/messages", json={**BODY, "system": "sys", "metadata": {"user_id": "u"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("msg_") and "-" not in body["id"]
    assert {k: v for k, v in body.items() if k != "id"} == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "aaa"}],
        "model": "fake",
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": len("system:sys|user:hi|assistant:"), "output_tokens": 3},
    }


def test_stop_sequence_is_reported(client: TestClient) -> None:
    body = client.post("/v1/messages", json={**BODY, "max_tokens": 5, "stop_sequences": ["zz", "aa"]}).json()
    assert (body["stop_reason"], body["stop_sequence"], body["content"]) == ("stop_sequence", "aa", [])


def test_stream_event_sequence(client: TestClient) -> None:
    events = _events(client, BODY)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(e["delta"]["text"] for name, e in events if name == "content_block_delta") == "aaa"
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == 3


def test_count_tokens_matches_the_usage(client: TestClient) -> None:
    conversation = {"model": "fake", "system": [{"type": "text", "text": "sys"}], "messages": BODY["messages"]}
    r = client.post("/v1/messages/count_tokens", json=conversation)
    assert r.status_code == 200 and r.json() == {"input_tokens": len("system:sys|user:hi|assistant:")}
    usage = client.post("/v1/messages", json={**BODY, **conversation}).json()["usage"]
    assert usage["input_tokens"] == r.json()["input_tokens"]


def test_errors_are_in_anthropic_shape(client: TestClient) -> None:
    missing = {k: v for k, v in BODY.items() if k != "max_tokens"}
    assert "max_tokens" in _error(client.post("/v1/messages", json=missing), 400, "invalid_request_error")
    assert "claude" in _error(client.post("/v1/messages", json={**BODY, "model": "claude"}), 404, "not_found_error")
    message = _error(client.post("/v1/messages", json={**BODY, "max_tokens": 0}), 400, "invalid_request_error")
    assert "max_tokens" in message
    stops = {**BODY, "stop_sequences": [""]}
    assert _error(client.post("/v1/messages", json=stops), 400, "invalid_request_error").startswith("stop_sequences")
    tools = {**BODY, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    # Tools without tool_choice mean "auto", which needs the server's tool-call parser (as chat completions do).
    auto = _error(client.post("/v1/messages", json=tools), 400, "invalid_request_error")
    assert auto.startswith('tool_choice {"type": "auto"}') and "--enable-auto-tool-choice" in auto
    assert "max_tokens" in _error(
        client.post("/v1/messages", json={**BODY, "max_tokens": 51}), 400, "invalid_request_error"
    )
    assert _error(client.post("/v1/messages", content=b"{"), 400, "invalid_request_error").startswith("malformed JSON")
    _error(client.post("/v1/messages/batches", json={}), 404, "not_found_error")
    _error(client.get("/v1/messages"), 405, "invalid_request_error")
    count = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert "max_tokens" in _error(client.post("/v1/messages/count_tokens", json=count), 400, "invalid_request_error")
    # The OpenAI routes keep OpenAI's shape.
    assert client.post("/v1/chat/completions", json={"model": "claude", "messages": []}).json()["error"]["type"]


def test_context_overflow_names_max_tokens() -> None:
    with TestClient(build_app(FakeEngine(max_len=40), ServeConfig())) as c:
        message = _error(c.post("/v1/messages", json={**BODY, "max_tokens": 30}), 400, "invalid_request_error")
        assert "maximum context length" in message and "max_tokens" in message


def test_failure_mid_stream_is_an_error_event(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_next_step = True
    events = _events(client, BODY)
    assert [name for name, _ in events][:2] == ["message_start", "ping"]
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] in ("invalid_request_error", "api_error")


def test_api_key_as_x_api_key_or_bearer() -> None:
    with TestClient(build_app(FakeEngine(), ServeConfig(api_key="k"))) as c:
        assert c.post("/v1/messages", json=BODY, headers={"x-api-key": "k"}).status_code == 200
        assert c.post("/v1/messages", json=BODY, headers={"Authorization": "Bearer k"}).status_code == 200
        wrong = c.post("/v1/messages", json=BODY, headers={"x-api-key": "nope"})
        assert "incorrect API key" in _error(wrong, 401, "authentication_error")
        assert "x-api-key" in _error(c.post("/v1/messages", json=BODY), 401, "authentication_error")
        # Either header right is enough; the OpenAI routes take x-api-key too and keep their error shape.
        both = {"x-api-key": "nope", "Authorization": "Bearer k"}
        assert c.post("/v1/messages", json=BODY, headers=both).status_code == 200
        chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert c.post("/v1/chat/completions", json=chat, headers={"x-api-key": "k"}).status_code == 200
        assert c.post("/v1/chat/completions", json=chat).json()["error"]["code"] == "missing_api_key"
