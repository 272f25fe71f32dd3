"""The official ``openai`` client against a live server: completions, chat, streaming, n, stop, logprobs, salts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from .serve_helpers import MODEL_NAME, MODES, ServerThread, serve

LONG_PROMPT = "The history of paged memory begins with virtual memory systems in the nineteen sixties. " * 6


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest, loaded: Any) -> Iterator[ServerThread]:
    with serve(loaded, mode=request.param) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client: OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_completion(client: OpenAI) -> None:
    r = client.completions.create(
        model=MODEL_NAME, prompt="Hello there", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion" and len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_streamed_completion_matches_the_unstreamed_one(client: OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": "Tell me a story",
        "max_tokens": 8,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8


def test_n_completions_with_a_seed_are_reproducible(client: OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "max_tokens": 6,
        "n": 3,
        "temperature": 1.0,
        "seed": 7,
        "extra_body": {"ignore_eos": True},
    }
    first = client.completions.create(**args)
    second = client.completions.create(**args)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert len({c.text for c in first.choices}) > 1, "n samples should differ"
    assert first.usage is not None and first.usage.completion_tokens == 18


def test_batched_prompts_get_one_choice_each(client: OpenAI) -> None:
    r = client.completions.create(
        model=MODEL_NAME, prompt=["one", "two"], max_tokens=3, temperature=0, n=2, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in r.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]  # greedy: both samples of a prompt agree


def test_stop_string_ends_the_text(client: OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": "Count with me",
        "max_tokens": 12,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    full = client.completions.create(**args).choices[0].text
    stop = full.strip()[len(full.strip()) // 2 :][:3]
    assert stop, full
    cut = client.completions.create(stop=[stop], **args).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]
    streamed = client.completions.create(stop=[stop], stream=True, **args)
    assert "".join(c.choices[0].text for c in streamed) == cut.text


def test_completion_logprobs(client: OpenAI) -> None:
    r = client.completions.create(
        model=MODEL_NAME,
        prompt="Logprobs please",
        max_tokens=4,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and len(top) == 3
        assert top[token] == pytest.approx(value) and value == pytest.approx(max(top.values()))  # greedy = top 1


def test_chat(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hi!"}],
        max_completion_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5


def test_streamed_chat_with_usage_and_logprobs(client: OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    streamed_lp = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []
    ]
    whole_lp = whole.choices[0].logprobs
    assert whole_lp is not None and whole_lp.content is not None and len(whole_lp.content) == 6
    assert [t.token for t in streamed_lp] == [t.token for t in whole_lp.content]
    for t in whole_lp.content:
        assert len(t.top_logprobs) == 2 and t.bytes is not None and bytes(t.bytes).decode("utf-8", "replace")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_chat_n_streamed(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Pick a word"}],
            n=2,
            max_tokens=4,
            temperature=1.0,
            seed=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length"}


def _cached(client: OpenAI, salt: str) -> int:
    r = client.completions.create(
        model=MODEL_NAME, prompt=LONG_PROMPT, max_tokens=2, temperature=0, extra_body={"cache_salt": salt}
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    return cached


def test_cache_salt_isolates_tenants(client: OpenAI) -> None:
    assert _cached(client, "tenant-a") == 0
    hit = _cached(client, "tenant-a")
    assert hit >= 32, "the same tenant should hit its own prefix"
    assert _cached(client, "tenant-b") == 0, "another tenant must not hit tenant-a's blocks"
    assert _cached(client, "tenant-a") == hit


def test_tokenize_and_detokenize_round_trip(server: ServerThread) -> None:
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) > 0
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert text.endswith("Hello world")
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > ids["count"]  # the template adds role markers
