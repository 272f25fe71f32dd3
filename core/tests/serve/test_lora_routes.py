"""LoRA adapters over HTTP, on a fake core: ``model`` picks the adapter on every generation route, ``/v1/models``
lists them, the runtime load/unload routes (404 without the flag, as vLLM), and ``return_token_ids``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from paged_core.errors import ConfigError
from paged_core.serve import ServeConfig, build_app
from paged_core.serve.lora_modules import LoRAModule

from .lora_fake_engine import LoRAFakeEngine, adapter_dir

CMPL = {"prompt": "hi", "max_tokens": 3}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def engine() -> LoRAFakeEngine:
    return LoRAFakeEngine()


def _client(engine: LoRAFakeEngine, tmp_path: Path, runtime: bool = False) -> TestClient:
    modules = (LoRAModule("sql", adapter_dir(tmp_path, "sql")), LoRAModule("poem", adapter_dir(tmp_path, "poem")))
    return TestClient(build_app(engine, ServeConfig(lora_modules=modules, enable_lora_runtime_updates=runtime)))


@pytest.fixture
def client(engine: LoRAFakeEngine, tmp_path: Path) -> Iterator[TestClient]:
    with _client(engine, tmp_path) as c:
        yield c


@pytest.fixture
def runtime(engine: LoRAFakeEngine, tmp_path: Path) -> Iterator[TestClient]:
    with _client(engine, tmp_path, runtime=True) as c:
        yield c


def _events(client: TestClient, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_modules_load_at_start_up_with_ids_in_order(client: TestClient, engine: LoRAFakeEngine) -> None:
    assert {i: lora.name for i, lora in engine.registered.items()} == {1: "sql", 2: "poem"}


def test_models_lists_the_base_then_each_adapter(client: TestClient, tmp_path: Path) -> None:
    cards = client.get("/v1/models").json()["data"]
    assert [(c["id"], c["object"], c["parent"]) for c in cards] == [
        ("fake", "model", None),
        ("sql", "model", "fake"),
        ("poem", "model", "fake"),
    ]
    assert cards[1]["root"] == str(tmp_path / "sql") and cards[2]["root"] == str(tmp_path / "poem")


@pytest.mark.parametrize(("model", "text", "lora_id"), [("fake", "aaa", None), ("sql", "lll", 1), ("poem", "mmm", 2)])
def test_completions_run_on_the_named_model(
    client: TestClient, engine: LoRAFakeEngine, model: str, text: str, lora_id: int | None
) -> None:
    body = client.post("/v1/completions", json={**CMPL, "model": model}).json()
    assert body["model"] == model and body["choices"][0]["text"] == text
    (lora,) = engine.loras.values()
    assert (lora.id if lora is not None else None) == lora_id
    events = _events(client, "/v1/completions", {**CMPL, "model": model, "stream": True})
    assert {e["model"] for e in events} == {model}
    assert "".join(e["choices"][0]["text"] for e in events) == text


def test_chat_and_messages_run_on_the_named_adapter(client: TestClient, engine: LoRAFakeEngine) -> None:
    body = client.post("/v1/chat/completions", json={**CHAT, "model": "poem"}).json()
    assert body["model"] == "poem" and body["choices"][0]["message"]["content"] == "mm"
    events = _events(client, "/v1/chat/completions", {**CHAT, "model": "sql", "stream": True})
    assert {e["model"] for e in events} == {"sql"}
    anthropic = {"model": "sql", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    message = client.post("/v1/messages", json=anthropic).json()
    assert message["model"] == "sql" and message["content"][0]["text"] == "ll"
    assert [lora.name if lora else None for lora in engine.loras.values()] == ["poem", "sql", "sql"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {**CMPL, "model": "nope"}),
        ("/v1/chat/completions", {**CHAT, "model": "nope"}),
        ("/tokenize", {"model": "nope", "prompt": "hi"}),
    ],
)
def test_an_unknown_model_is_a_404_naming_it(client: TestClient, engine: LoRAFakeEngine, path: str, body: Any) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["message"] == "the model 'nope' does not exist; this server serves 'fake', 'sql', 'poem'"
    assert engine.loras == {}


def test_an_unknown_model_on_messages_is_anthropics_404(client: TestClient) -> None:
    body = {"model": "nope", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 404 and r.json()["type"] == "error"
    assert "'nope' does not exist" in r.json()["error"]["message"]


def test_runtime_routes_do_not_exist_without_the_flag(client: TestClient) -> None:
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        r = client.post(path, json={"lora_name": "sql", "lora_path": "/x"})
        assert r.status_code == 404 and r.json()["error"]["message"] == f"no route {path}"


def test_runtime_load_and_unload(runtime: TestClient, engine: LoRAFakeEngine, tmp_path: Path) -> None:
    path = adapter_dir(tmp_path, "chat")
    r = runtime.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": path})
    assert r.status_code == 200 and r.text == "LoRA adapter 'chat' loaded (id 3)"
    assert engine.registered[3].path == path
    assert [c["id"] for c in runtime.get("/v1/models").json()["data"]] == ["fake", "sql", "poem", "chat"]
    assert runtime.post("/v1/completions", json={**CMPL, "model": "chat"}).json()["choices"][0]["text"] == "nnn"
    r = runtime.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert r.status_code == 200 and r.text == "LoRA adapter 'sql' unloaded"
    assert engine.removed == [1] and 1 not in engine.registered  # nothing ran on it: forgotten at once
    assert runtime.post("/v1/completions", json={**CMPL, "model": "sql"}).status_code == 404
    assert [c["id"] for c in runtime.get("/v1/models").json()["data"]] == ["fake", "poem", "chat"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"lora_name": "poem", "lora_path": "{tmp}"}, 400, "the LoRA adapter 'poem' is already loaded"),
        ({"lora_name": "fake", "lora_path": "{tmp}"}, 400, "'fake' is the base model's served name"),
        (
            {"lora_name": "broken", "lora_path": "{tmp}/missing"},
            400,
            "LoRA adapter 'broken' ({tmp}/missing): adapter_config.json is missing",
        ),
        ({"lora_name": "x"}, 400, "missing required parameter: 'lora_path'"),
        ({"lora_name": "", "lora_path": "/p"}, 400, "invalid value for 'lora_name'"),
        ({"lora_name": "x", "lora_path": "/p", "load_inplace": True}, 400, "unrecognized request argument"),
    ],
)
def test_bad_loads_are_400s_naming_the_problem(
    runtime: TestClient, engine: LoRAFakeEngine, tmp_path: Path, body: dict[str, Any], status: int, message: str
) -> None:
    body = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in body.items()}
    r = runtime.post("/v1/load_lora_adapter", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"].startswith(message.replace("{tmp}", str(tmp_path))), r.json()
    assert sorted(engine.registered) == [1, 2]
    assert [c["id"] for c in runtime.get("/v1/models").json()["data"]] == ["fake", "sql", "poem"]


def test_unloading_an_unknown_adapter_is_a_404(runtime: TestClient) -> None:
    for name in ("nope", "fake"):
        r = runtime.post("/v1/unload_lora_adapter", json={"lora_name": name})
        assert r.status_code == 404 and r.json()["error"]["message"] == f"the LoRA adapter '{name}' is not loaded"


def test_a_start_up_module_that_does_not_load_stops_the_app(engine: LoRAFakeEngine, tmp_path: Path) -> None:
    config = ServeConfig(lora_modules=(LoRAModule("bad", str(tmp_path / "none")),))
    app = build_app(engine, config)
    with pytest.raises(ConfigError, match=r"--lora-modules bad: LoRA adapter 'bad' .* adapter_config\.json is missing"):
        with TestClient(app):
            pass
    assert app.state.paged.startup_error is not None and "'bad'" in app.state.paged.startup_error


def test_return_token_ids_on_completions(client: TestClient) -> None:
    body = client.post("/v1/completions", json={**CMPL, "model": "sql", "prompt": ["hi", "yo"], "n": 2}).json()
    assert all("token_ids" not in c and "prompt_token_ids" not in c for c in body["choices"])
    body = client.post(
        "/v1/completions", json={**CMPL, "model": "sql", "prompt": ["hi", "yo"], "n": 2, "return_token_ids": True}
    ).json()
    prompts = [[ord("h"), ord("i")], [ord("y"), ord("o")]]
    assert [c["prompt_token_ids"] for c in body["choices"]] == [prompts[0], prompts[0], prompts[1], prompts[1]]
    assert all(c["token_ids"] == [ord("l")] * 3 for c in body["choices"])
    events = _events(
        client,
        "/v1/completions",
        {**CMPL, "model": "sql", "prompt": ["hi", "yo"], "n": 2, "stream": True, "return_token_ids": True},
    )
    for index in range(4):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert mine[0]["prompt_token_ids"] == prompts[index // 2]
        assert all("prompt_token_ids" not in c for c in mine[1:])
        assert [t for c in mine for t in c["token_ids"]] == [ord("l")] * 3


def test_return_token_ids_on_chat(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", json={**CHAT, "model": "fake"}).json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    body = client.post("/v1/chat/completions", json={**CHAT, "model": "fake", "return_token_ids": True}).json()
    rendered = [ord(ch) for ch in "user:hi|assistant:"]
    assert body["prompt_token_ids"] == rendered and body["choices"][0]["token_ids"] == [ord("a")] * 2
    events = _events(
        client, "/v1/chat/completions", {**CHAT, "model": "poem", "n": 2, "stream": True, "return_token_ids": True}
    )
    assert events[0]["prompt_token_ids"] == rendered
    assert all("prompt_token_ids" not in e for e in events[1:])
    for index in range(2):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert [t for c in mine for t in c["token_ids"]] == [ord("m")] * 2


def test_openapi_documents_the_new_fields(runtime: TestClient) -> None:
    doc = runtime.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert "return_token_ids" in schemas["CompletionRequest"]["properties"]
    assert "prompt_token_ids" in schemas["ChatCompletionResponse"]["properties"]
    assert {"root", "parent"} <= set(schemas["ModelCard"]["properties"])
    assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} <= set(doc["paths"])
