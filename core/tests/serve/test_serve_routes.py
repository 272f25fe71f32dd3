"""The HTTP routes over a fake engine: response shapes, SSE framing, n, echo, logprobs, errors mid-stream."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi.testclient import TestClient

from .fake_engine import REFUSED_TOKEN, FakeEngine

BASE = {"model": "fake", "prompt": "hi", "max_tokens": 3}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _events(client: TestClient, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_completion_shape_and_usage(client: TestClient) -> None:
    r = client.post("/v1/completions", json=BASE)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "fake" and body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"index": 0, "text": "aaa", "logprobs": None, "finish_reason": "length", "stop_reason": None}
    ]
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_batched_prompts_with_n_index_choices_in_order(client: TestClient) -> None:
    body = client.post("/v1/completions", json={**BASE, "prompt": [[120], [104, 105]], "n": 2}).json()
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "aaa"), (1, "bbb"), (2, "aaa"), (3, "bbb")]
    assert body["usage"]["completion_tokens"] == 12


def test_echo_prepends_the_prompt(client: TestClient) -> None:
    body = client.post("/v1/completions", json={**BASE, "echo": True}).json()
    assert body["choices"][0]["text"] == "hiaaa"
    events = _events(client, "/v1/completions", {**BASE, "echo": True, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events) == "hiaaa"


def test_streamed_completion_chunks_and_usage(client: TestClient) -> None:
    events = _events(
        client, "/v1/completions", {**BASE, "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    )
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(c["text"] for c in choices if c["index"] == 1) == "bbb"
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["length", "length"]
    assert all(e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


def test_completion_logprobs_layout(client: TestClient) -> None:
    lp = client.post("/v1/completions", json={**BASE, "logprobs": 1}).json()["choices"][0]["logprobs"]
    assert lp == {
        "tokens": ["a"] * 3,
        "token_logprobs": [-0.5] * 3,
        "top_logprobs": [{"a": -0.5}] * 3,
        "text_offset": [0, 1, 2],
    }
    events = _events(client, "/v1/completions", {**BASE, "logprobs": 2, "stream": True})
    offsets = [o for e in events if e["choices"][0]["logprobs"] for o in e["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 1, 2]
    assert events[0]["choices"][0]["logprobs"]["top_logprobs"] == [{"a": -0.5, "\u00c8": -1.5}]


def test_chat_shape_and_logprobs(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 1}).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "aa"} and choice["finish_reason"] == "length"
    top = [{"token": "a", "logprob": -0.5, "bytes": [97]}]
    assert choice["logprobs"]["content"][0] == {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": top}
    # The fake template renders "user:hi|assistant:" (18 characters = 18 tokens).
    assert body["usage"]["prompt_tokens"] == len("user:hi|assistant:")


def test_streamed_chat_opens_with_the_role_and_closes_with_the_reason(client: TestClient) -> None:
    events = _events(client, "/v1/chat/completions", {**CHAT, "stream": True, "n": 2})
    first = [e["choices"][0] for e in events[:2]]
    assert [c["delta"] for c in first] == [{"role": "assistant", "content": ""}] * 2
    text = {0: "", 1: ""}
    for e in events:
        c = e["choices"][0]
        text[c["index"]] += c["delta"].get("content", "")
    assert text == {0: "aa", 1: "bb"}
    last = [e["choices"][0] for e in events if e["choices"][0]["finish_reason"]]
    assert [(c["index"], c["delta"]) for c in last] == [(0, {}), (1, {})]


def test_default_chat_max_tokens_fills_the_context() -> None:
    from paged_core.serve import ServeConfig, build_app

    engine = FakeEngine(max_len=25)
    with TestClient(build_app(engine, ServeConfig())) as c:
        body = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": None}).json()
    assert body["usage"]["completion_tokens"] == 25 - len("user:hi|assistant:")


def test_refused_request_is_a_400_naming_the_field(client: TestClient, engine: FakeEngine) -> None:
    r = client.post("/v1/completions", json={**BASE, "prompt": [5, REFUSED_TOKEN]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens" and "SamplingParams" not in r.json()["error"]["message"]
    assert not engine.groups


def test_refused_streaming_request_starts_at_once_and_ends_with_the_400_as_an_error_event(
    client: TestClient, engine: FakeEngine
) -> None:
    # No admission round trip: the stream is open (200) before the core has read the request, so the core's
    # refusal ends it as an SSE error event carrying the very body a non-streaming request gets as its 400.
    plain = client.post("/v1/completions", json={**BASE, "prompt": [5, REFUSED_TOKEN]})
    assert plain.status_code == 400
    events = _events(client, "/v1/completions", {**BASE, "prompt": [5, REFUSED_TOKEN], "stream": True})
    assert events == [plain.json()]
    # In a batch, the refused prompt ends the stream and its neighbour is aborted.
    events = _events(
        client, "/v1/completions", {**BASE, "prompt": [[5], [5, REFUSED_TOKEN]], "max_tokens": 50, "stream": True}
    )
    assert events[-1] == plain.json()
    refused_chat = [{"role": "user", "content": chr(REFUSED_TOKEN)}]
    chat = _events(client, "/v1/chat/completions", {**CHAT, "messages": refused_chat, "stream": True})
    assert chat[-1]["error"]["param"] == "max_tokens" and chat[0]["choices"][0]["delta"]["role"] == "assistant"
    for _ in range(100):
        if not engine.groups:
            break
        time.sleep(0.01)
    assert not engine.groups and client.app.state.paged.admission.in_flight == 0  # type: ignore[attr-defined]


def test_failed_step_ends_the_stream_with_an_error_event(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_next_step = True
    events = _events(client, "/v1/completions", {**BASE, "stream": True})
    error = events[-1]["error"]
    # The body carries an error id to find in the log, never the exception's text.
    assert error["type"] == "server_error" and "error id" in error["message"] and "simulated" not in error["message"]
    assert client.post("/v1/completions", json=BASE).status_code == 200  # the server keeps serving


def test_failed_step_fails_a_plain_request_with_500(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_next_step = True
    r = client.post("/v1/completions", json=BASE)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_health_turns_503_when_the_engine_thread_dies(client: TestClient, engine: FakeEngine) -> None:
    assert client.get("/health").status_code == 200

    def broken() -> bool:
        raise RuntimeError("scheduler corrupted")

    engine.has_unfinished_requests = broken  # type: ignore[method-assign]
    client.post("/v1/completions", json=BASE)  # wakes the thread, which dies on the broken engine
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["error"]["message"] == "engine is not running"
    r = client.post("/v1/completions", json=BASE)
    assert r.status_code == 503 and "engine" in r.json()["error"]["message"]


def test_models_tokenize_detokenize(client: TestClient) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "fake"
    assert client.post("/tokenize", json={"prompt": "ab"}).json() == {
        "tokens": [97, 98],
        "count": 2,
        "max_model_len": 100,
    }
    assert client.post("/detokenize", json={"tokens": [97, 98]}).json() == {"prompt": "ab"}
    r = client.post("/tokenize", json={"prompt": "ab", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "exactly one" in r.json()["error"]["message"]
    assert client.post("/tokenize", json={"prompt": "x", "model": "other"}).status_code == 404
