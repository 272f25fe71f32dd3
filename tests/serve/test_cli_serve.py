"""``paged serve MODEL --port P --api-key K`` in a subprocess, driven by the openai client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from .serve_helpers import API_KEY, free_socket, wait_healthy


@pytest.fixture(scope="module")
def cli_server(tiny_model_dir: Path, backend_name: str) -> Iterator[str]:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # the child binds it; a clash would show as the server failing to start
    cmd = [
        sys.executable,
        "-m",
        "paged_core.cli.main",
        "serve",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--api-key",
        API_KEY,
        "--backend",
        backend_name,
        "--kv-cache-memory",
        "2MiB",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, headers={}, timeout=90, proc=proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_cli_server_answers_with_the_right_key(cli_server: str, tiny_model_dir: Path) -> None:
    client = OpenAI(base_url=f"{cli_server}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [tiny_model_dir.name]
    r = client.completions.create(model=tiny_model_dir.name, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 3


def test_cli_server_refuses_a_wrong_key(cli_server: str, tiny_model_dir: Path) -> None:
    client = OpenAI(base_url=f"{cli_server}/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
        client.models.list()


def test_serve_help_lists_the_server_options() -> None:
    from paged_core.cli.main import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for option in ("--host", "--port", "--api-key", "--kv-cache-memory", "MODEL"):
        assert option in help_text
