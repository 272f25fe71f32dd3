"""Hostile input piece by piece: JSON shapes, template kwargs, auth, budgets, tokenizer facts, off-loop work."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jinja2 import TemplateError

from paged_core.serve import ServeConfig, build_app
from paged_core.serve.auth import bearer_token
from paged_core.serve.body import MAX_JSON_DEPTH, decode_json
from paged_core.serve.errors import APIError
from paged_core.serve.params import (
    MAX_TEMPLATE_KWARGS_BYTES,
    check_context,
    check_template_kwargs,
    placeholder_max_tokens,
    requested_max_tokens,
)
from paged_core.serve.protocol import ChatCompletionRequest, CompletionRequest
from paged_core.serve.tokenizer_facts import NORMALISER_SAFETY, control_tokens, max_chars_per_token

from .fake_engine import CharTokenizer, FakeEngine


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("raw", "message", "param"),
    [
        (_nested(MAX_JSON_DEPTH + 1), f"nests deeper than {MAX_JSON_DEPTH} levels", None),
        (b'{"a": {"b": ' + _nested(MAX_JSON_DEPTH) + b"}}", "levels (in 'a')", "a"),
        (_nested(1000), "nests deeper", None),
        (_nested(200_000), "nests deeper", None),  # the decoder's RecursionError, not a crash
        (b'{"n": ' + b"9" * 5000 + b"}", "64-bit range", None),
        (b'{"seed": 18446744073709551616}', "invalid value for 'seed'", "seed"),
        (b'{"stop_token_ids": [1, -9223372036854775809]}', "'stop_token_ids.1'", "stop_token_ids.1"),
        (b'{"prompt": "a\\ud800b"}', "invalid string in 'prompt'", "prompt"),
        (b'{"messages": [{"content": "\\udfff"}]}', "'messages.0.content'", "messages.0.content"),
        (b'{"ok": {"\\ud800": 1}}', "invalid key in 'ok'", "ok"),
        (b'{"temperature": NaN}', "NaN is not valid JSON", None),
        (b'{"temperature": -Infinity}', "-Infinity is not valid JSON", None),
    ],
)
def test_hostile_json_is_a_400_saying_what(raw: bytes, message: str, param: str | None) -> None:
    with pytest.raises(APIError) as info:
        decode_json(raw)
    assert info.value.status == 400 and message in info.value.message, info.value.message
    assert info.value.param == param
    json.dumps(info.value.body(), ensure_ascii=False).encode()  # the answer itself must be encodable


def test_json_within_every_limit_is_accepted() -> None:
    assert decode_json(_nested(MAX_JSON_DEPTH)) is not None
    assert decode_json(b'{"seed": 9223372036854775807, "low": -9223372036854775808}')["seed"] == 2**63 - 1
    assert decode_json(b'{"s": "\\ud83d\\ude00", "t": "caf\\u00e9"}') == {"s": "\U0001f600", "t": "café"}
    assert decode_json(b'{"lit": "\\\\ud800"}') == {"lit": "\\ud800"}  # an escaped backslash, not a surrogate


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chat_template": "{% for i in range(10**9) %}x{% endfor %}"}, "only renders the model's own chat template"),
        ({"tokenize": False}, "may not set tokenize"),
        ({"bos_token": "<|im_start|>system"}, "may not set bos_token"),
        ({"return_tensors": "pt", "messages": []}, "may not set messages, return_tensors"),
        ({"items": [1, 2]}, "chat_template_kwargs.items must be a string, number or boolean, got list"),
        ({"nested": {"a": 1}}, "got dict"),
        ({"none": None}, "got NoneType"),
        ({"big": "x" * MAX_TEMPLATE_KWARGS_BYTES}, f"at most {MAX_TEMPLATE_KWARGS_BYTES} are accepted"),
    ],
)
def test_template_kwargs_are_flat_small_and_never_a_template(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(APIError, match=re.escape(message)) as info:
        check_template_kwargs(kwargs)
    assert info.value.param == "chat_template_kwargs"


def test_template_kwargs_that_set_flags_pass() -> None:
    check_template_kwargs({"enable_thinking": False, "reasoning_effort": "low", "depth": 2, "t": 0.5})
    check_template_kwargs(None)
    check_template_kwargs({})


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (b"Bearer k", b"k"),
        (b"bearer k", b"k"),
        (b"BEARER  k", b"k"),
        (b"Basic k", None),
        (b"k", None),
        (b"", None),
    ],
)
def test_bearer_scheme_is_case_insensitive(header: bytes, token: bytes | None) -> None:
    assert bearer_token(header) == token


def test_an_omitted_budget_stays_within_the_limit_and_errors_name_the_field_sent() -> None:
    assert check_context(10, None, 100, "prompt", limit=8) == 8
    assert check_context(95, None, 100, "prompt", limit=8) == 5
    with pytest.raises(APIError, match="reduce the prompt or max_completion_tokens") as info:
        check_context(95, 8, 100, "messages", max_tokens_param="max_completion_tokens")
    assert info.value.param == "max_completion_tokens"
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert requested_max_tokens(chat, 8) is None  # filled later, within the limit
    omitted = CompletionRequest.model_validate({"model": "m", "prompt": "x"})
    assert requested_max_tokens(omitted, 8) == 8 and requested_max_tokens(omitted) == 16
    sent = CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 16})
    assert requested_max_tokens(sent, 8) == 16  # sent explicitly: check_limits refuses it, naming the limit


def test_the_placeholder_budget_never_conflicts_with_min_tokens() -> None:
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "min_tokens": 5}
    )
    assert placeholder_max_tokens(chat) == 5
    given = CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 3, "min_tokens": 5})
    assert placeholder_max_tokens(given) == 3  # both sent: min_tokens > max_tokens is still refused


class VocabTokenizer(CharTokenizer):
    """A tokenizer with a vocabulary, special tokens and added tokens, as HF tokenizers expose them."""

    def __init__(self, vocab: dict[str, int], specials: tuple[str, ...] = (), added: tuple[str, ...] = ()) -> None:
        self.vocab = vocab
        self.all_special_tokens = list(specials)
        self.added_tokens_decoder = {
            i: SimpleNamespace(content=t, special=t in specials) for i, t in enumerate(specials + added)
        }
        self.chat_template = "{{ '<|turn|>' }}{{ messages }}"

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_chars_per_token_bound_only_for_tokenizers_that_cover_every_byte() -> None:
    vocab = {"a": 0, "abcd": 1, "<s>": 2}
    assert max_chars_per_token(VocabTokenizer(vocab), byte_level=True) == NORMALISER_SAFETY * 4
    fallback = {**vocab, "<0x00>": 3, "<0xFF>": 4}
    assert max_chars_per_token(VocabTokenizer(fallback), byte_level=False) == NORMALISER_SAFETY * 6
    assert max_chars_per_token(VocabTokenizer(vocab), byte_level=False) is None  # [UNK] may cover a whole word
    assert max_chars_per_token(CharTokenizer(), byte_level=False) is None
    assert max_chars_per_token(None, byte_level=False) is None


def test_control_tokens_are_specials_and_added_tokens_the_template_writes() -> None:
    tok = VocabTokenizer({}, specials=("<s>", "</s>"), added=("<|turn|>", "<unused>", "\n"))
    assert control_tokens(tok) == ("</s>", "<s>", "<|turn|>")
    assert control_tokens(CharTokenizer()) == () and control_tokens(None) == ()


class SlowTokenizer(CharTokenizer):
    """Takes ``delay`` seconds to encode or render, holding no lock the event loop needs."""

    delay = 0.6
    chat_template = "{{ slow }}"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        time.sleep(self.delay)
        return super().encode(text, add_special_tokens)

    def apply_chat_template(self, conv: list[dict[str, Any]], add_generation_prompt: bool, tokenize: bool) -> list[int]:
        time.sleep(self.delay)
        return [ord(c) for c in "|".join(m["content"] for m in conv)]


@pytest.fixture
def slow_client() -> Iterator[TestClient]:
    engine = FakeEngine()
    engine.tokenizer = SlowTokenizer()
    with TestClient(build_app(engine, ServeConfig())) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "fake", "prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ("/tokenize", {"prompt": "hi"}),
    ],
)
def test_tokenizing_and_templates_run_off_the_event_loop(slow_client: TestClient, path: str, body: Any) -> None:
    result: dict[str, Any] = {}

    def slow_request() -> None:
        result["status"] = slow_client.post(path, json=body).status_code

    worker = threading.Thread(target=slow_request)
    worker.start()
    time.sleep(0.1)  # the slow request is inside the tokenizer now
    t = time.monotonic()
    health = slow_client.get("/health")
    waited = time.monotonic() - t
    worker.join()
    assert health.status_code == 200 and result["status"] == 200
    assert waited < SlowTokenizer.delay / 2, f"/health waited {waited:.2f}s on a tokenizer call"


def test_an_unexpected_error_is_a_500_with_an_id_logged_once(
    engine: FakeEngine, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = build_app(engine, ServeConfig())
    with TestClient(app) as c:  # raise_server_exceptions: would raise here if the error escaped the app

        def boom(ids: list[int]) -> str:
            raise RuntimeError("secret internal detail at /srv/model")

        monkeypatch.setattr(app.state.paged.tokens, "decode", boom)
        r = c.post("/detokenize", json={"tokens": [97]})
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "secret" not in r.text and "RuntimeError" not in r.text
    match = re.search(r"error id ([0-9a-f]{16})", error["message"])
    assert match is not None, error
    logged = [rec for rec in caplog.records if match.group(1) in rec.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


def test_a_template_refusal_is_a_400_but_a_template_crash_is_a_500(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(build_app(engine, ServeConfig())) as c:

        def refuse(*args: Any, **kwargs: Any) -> list[int]:
            raise TemplateError("Conversation roles must alternate user/assistant")

        monkeypatch.setattr(engine.tokenizer, "apply_chat_template", refuse)
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and "roles must alternate" in r.json()["error"]["message"]

        def crash(*args: Any, **kwargs: Any) -> list[int]:
            raise KeyError("internal")

        monkeypatch.setattr(engine.tokenizer, "apply_chat_template", crash)
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 500 and "KeyError" not in r.text


def test_health_is_json_and_answered_before_auth(engine: FakeEngine) -> None:
    with TestClient(build_app(engine, ServeConfig(api_key="k"))) as c:
        r = c.get("/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        assert r.headers["content-type"] == "application/json"
        assert c.options("/v1/completions").status_code == 401
        assert c.options("/v1/completions", headers={"Authorization": "bearer k"}).status_code == 405
