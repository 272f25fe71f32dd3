"""Bad input gets a 4xx in OpenAI's error shape naming what is wrong, and the server stays healthy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .serve_helpers import API_KEY, MODEL_NAME, MODES, ServerThread, serve

AUTH = {"Authorization": f"Bearer {API_KEY}"}
GOOD = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
LONG = "word " * 600  # far beyond max_model_len (512)


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest, loaded: Any) -> Iterator[ServerThread]:
    from paged_core.serve import ServeConfig

    config = ServeConfig(
        served_model_name=MODEL_NAME, api_key=API_KEY, max_n=4, max_tokens_limit=64, max_body_bytes=64 * 1024
    )
    with serve(loaded, config, mode=request.param) as s:
        yield s


def _raw(body: bytes) -> dict[str, Any]:
    return {"content": body, "headers": {**AUTH, "Content-Type": "application/json"}}


def _json(body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"json": body, "headers": AUTH if headers is None else headers}


# (name, path, request kwargs, status, substring of the message, param or None)
CASES: list[tuple[str, str, dict[str, Any], int, str, str | None]] = [
    ("malformed json", "/v1/completions", _raw(b'{"model": "tiny-chat", "prompt": '), 400, "malformed JSON", None),
    (
        "invalid utf-8",
        "/v1/completions",
        _raw(b'{"model": "tiny-chat", "prompt": "\xff\xfe"}'),
        400,
        "not valid UTF-8",
        None,
    ),
    ("empty body", "/v1/completions", _raw(b""), 400, "request body is empty", None),
    ("not an object", "/v1/completions", _json([1, 2]), 400, "must be a JSON object", None),
    ("missing model", "/v1/completions", _json({"prompt": "x"}), 400, "missing required parameter: 'model'", "model"),
    (
        "wrong type max_tokens",
        "/v1/completions",
        _json({**GOOD, "max_tokens": "ten"}),
        400,
        "invalid value for 'max_tokens'",
        "max_tokens",
    ),
    ("wrong type prompt", "/v1/completions", _json({**GOOD, "prompt": 5}), 400, "invalid type for 'prompt'", "prompt"),
    (
        "string temperature",
        "/v1/chat/completions",
        _json({**CHAT, "temperature": "hot"}),
        400,
        "invalid value for 'temperature'",
        "temperature",
    ),
    ("messages not a list", "/v1/chat/completions", _json({**CHAT, "messages": "hi"}), 400, "'messages'", "messages"),
    (
        "unknown field",
        "/v1/completions",
        _json({**GOOD, "frobnicate": 1}),
        400,
        "unrecognized request argument(s) supplied: frobnicate",
        "frobnicate",
    ),
    (
        "unknown chat field",
        "/v1/chat/completions",
        _json({**CHAT, "temprature": 0.5}),
        400,
        "unrecognized request argument(s) supplied: temprature",
        "temprature",
    ),
    ("prompt too long", "/v1/completions", _json({**GOOD, "prompt": LONG}), 400, "maximum context length is 512", None),
    (
        "chat too long",
        "/v1/chat/completions",
        _json({**CHAT, "messages": [{"role": "user", "content": LONG}]}),
        400,
        "maximum context length is 512",
        "messages",
    ),
    (
        "prompt + max_tokens too long",
        "/v1/completions",
        _json({**GOOD, "prompt": "word " * 480, "max_tokens": 60}),
        400,
        "were requested",
        "max_tokens",
    ),
    (
        "max_tokens over the limit",
        "/v1/completions",
        _json({**GOOD, "max_tokens": 65}),
        400,
        "max_tokens must be at most 64",
        "max_tokens",
    ),
    (
        "max_completion_tokens over the limit",
        "/v1/chat/completions",
        _json({**CHAT, "max_completion_tokens": 1000}),
        400,
        "max_completion_tokens must be at most 64",
        "max_completion_tokens",
    ),
    ("max_tokens zero", "/v1/completions", _json({**GOOD, "max_tokens": 0}), 400, "max_tokens must be", "max_tokens"),
    ("n too large", "/v1/completions", _json({**GOOD, "n": 5}), 400, "n must be at most 4", "n"),
    ("n zero", "/v1/chat/completions", _json({**CHAT, "n": 0}), 400, "n must be", "n"),
    (
        "negative temperature",
        "/v1/completions",
        _json({**GOOD, "temperature": -1}),
        400,
        "temperature must be",
        "temperature",
    ),
    ("top_p above one", "/v1/completions", _json({**GOOD, "top_p": 1.5}), 400, "top_p must be", "top_p"),
    ("too many logprobs", "/v1/completions", _json({**GOOD, "logprobs": 50}), 400, "logprobs must be", "logprobs"),
    (
        "top_logprobs without logprobs",
        "/v1/chat/completions",
        _json({**CHAT, "top_logprobs": 2}),
        400,
        "top_logprobs requires logprobs",
        "top_logprobs",
    ),
    (
        "token id out of range",
        "/v1/completions",
        _json({**GOOD, "prompt": [1, 2, 10**9]}),
        400,
        "token ids must be in [0, 49152)",
        "prompt",
    ),
    ("empty prompt", "/v1/completions", _json({**GOOD, "prompt": ""}), 400, "prompt is empty", "prompt"),
    ("empty messages", "/v1/chat/completions", _json({**CHAT, "messages": []}), 400, "'messages'", "messages"),
    (
        "unknown role",
        "/v1/chat/completions",
        _json({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}),
        400,
        "invalid value for 'messages.0.role'",
        "messages.0.role",
    ),
    (
        "unknown model",
        "/v1/completions",
        _json({**GOOD, "model": "gpt-9"}),
        404,
        "the model 'gpt-9' does not exist",
        "model",
    ),
    (
        "unknown model in chat",
        "/v1/chat/completions",
        _json({**CHAT, "model": "gpt-9"}),
        404,
        "does not exist",
        "model",
    ),
    ("missing api key", "/v1/completions", _json(GOOD, headers={}), 401, "missing API key", None),
    (
        "wrong api key",
        "/v1/completions",
        _json(GOOD, headers={"Authorization": "Bearer nope"}),
        401,
        "incorrect API key",
        None,
    ),
    ("api key without bearer", "/v1/models", {"headers": {"Authorization": API_KEY}}, 401, "incorrect API key", None),
    (
        "body too large",
        "/v1/completions",
        _json({**GOOD, "prompt": "x" * 70_000}),
        413,
        "exceeds the limit of 65536",
        None,
    ),
    (
        "unsupported logit_bias",
        "/v1/completions",
        _json({**GOOD, "logit_bias": {"5": 1.0}}),
        400,
        "logit_bias is not supported",
        "logit_bias",
    ),
    ("detokenize bad ids", "/detokenize", _json({"tokens": [-1]}), 400, "token ids must be in", "tokens"),
    ("unknown route", "/v1/engines", _json(GOOD), 404, "no route /v1/engines", None),
]


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "message", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_a_clear_4xx(
    server: ServerThread, path: str, kwargs: dict[str, Any], status: int, message: str, param: str | None
) -> None:
    method = "GET" if path == "/v1/models" else "POST"
    r = httpx.request(method, f"{server.url}{path}", timeout=30, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert message in body["error"]["message"], body
    assert body["error"]["type"] in ("invalid_request_error", "authentication_error", "not_found_error")
    if param is not None:
        assert body["error"]["param"] == param, body


def test_wrong_method_is_405(server: ServerThread) -> None:
    r = httpx.get(f"{server.url}/v1/completions", headers=AUTH)
    assert r.status_code == 405 and "not allowed" in r.json()["error"]["message"]


def test_health_and_metrics_need_no_key(server: ServerThread) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_server_stays_healthy_for_others(server: ServerThread) -> None:
    # A good stream keeps flowing while bad requests arrive in the middle of it.
    body = {**GOOD, "max_tokens": 64, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=AUTH, timeout=60, json=body) as s:
        assert s.status_code == 200
        events = s.iter_lines()
        first = next(e for e in events if e.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"] is not None
        for _, path, kwargs, status, _, _ in CASES[:12]:
            assert httpx.post(f"{server.url}{path}", timeout=30, **kwargs).status_code == status
        rest = [e for e in events if e.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    finish = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in rest[:-1]]
    assert finish[-1] == "length"
    assert httpx.get(f"{server.url}/health").status_code == 200
    ok = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, json=CHAT, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
