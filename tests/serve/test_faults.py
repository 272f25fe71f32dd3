"""Faults with real processes: ``paged serve`` (API server + engine-core process) when either dies or is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch

from .serve_helpers import free_socket, save_tiny_chat_model, wait_healthy

pytestmark = pytest.mark.serial  # bounds on how fast killed processes end the streams

STREAMS = 16


@contextlib.contextmanager
def cli_server(
    tiny_model_dir: Path, backend_name: str, *extra: str
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """``paged serve`` in a subprocess (multi-process by default): it, its URL and its output file; killed at the end.

    The output goes to a file, not a pipe: a pipe nobody reads fills at 64 KiB and then blocks the server.
    """
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    cmd = [
        sys.executable,
        "-m",
        "paged_core.cli.main",
        "serve",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--backend",
        backend_name,
        "--kv-cache-memory",
        "2MiB",
        "--log-level",
        "warning",
        *extra,
    ]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    with tempfile.NamedTemporaryFile("w", prefix="paged-serve-", suffix=".log", delete=False) as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc, f"http://127.0.0.1:{port}", Path(out.name)
    finally:
        family = _family(proc.pid)
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.kill()
        proc.wait()
        Path(out.name).unlink(missing_ok=True)


def _family(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _core_of(proc: subprocess.Popen[str]) -> psutil.Process:
    """The engine-core child of a ``paged serve`` process."""
    children = [c for c in psutil.Process(proc.pid).children() if "engine_core.loop" in " ".join(c.cmdline())]
    assert len(children) == 1, f"expected one engine-core child, got {children}"
    return children[0]


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(p: psutil.Process, timeout: float) -> float:
    """Seconds until ``p`` is gone (fails after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if _gone(p):
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"process {p.pid} still alive after {timeout} s")


async def _stream(
    url: str, i: int, started: asyncio.Event, counter: list[int], total: int, max_tokens: int
) -> tuple[list[str], float]:
    """One long streaming completion: its data lines and when it ended (monotonic); sets ``started`` at ``total``."""
    body = {
        "model": "tiny",
        "prompt": f"stream {i} tells a long story",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    lines: list[str] = []
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 1:
                        counter[0] += 1
                        if counter[0] == total:
                            started.set()
    return lines, time.monotonic()


async def _streams_until(
    url: str, action: Any, streams: int = STREAMS, max_tokens: int = 400
) -> tuple[list[tuple[list[str], float]], float]:
    """Run ``streams`` streams; once all have a first chunk, call ``action()``; returns the streams and when."""
    started, counter = asyncio.Event(), [0]
    tasks = [asyncio.create_task(_stream(url, i, started, counter, streams, max_tokens)) for i in range(streams)]
    await asyncio.wait_for(started.wait(), 120)
    when = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, action)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    return [r for r in results if not isinstance(r, BaseException)], when


def test_core_killed_mid_stream_ends_every_stream_with_an_error_and_the_server_exits(
    tiny_model_dir: Path, backend_name: str
) -> None:
    with cli_server(tiny_model_dir, backend_name, "--served-model-name", "tiny") as (proc, url, _):
        wait_healthy(url, headers={}, timeout=120, proc=proc)
        core = _core_of(proc)
        streams, killed_at = asyncio.run(_streams_until(url, lambda: os.kill(core.pid, signal.SIGKILL)))
        health = httpx.get(f"{url}/health", timeout=5)
        refused = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=5)
        assert len(streams) == STREAMS
        for lines, ended in streams:
            assert lines[-1] == "[DONE]" and "error" in json.loads(lines[-2])
            assert "engine core process died (killed by SIGKILL)" in json.loads(lines[-2])["error"]["message"]
            assert ended - killed_at < 1.0, f"a stream took {ended - killed_at:.2f} s to end"
        assert health.status_code == 503
        assert refused.status_code == 503
        assert proc.wait(15) != 0


def test_api_server_killed_takes_the_core_down(tiny_model_dir: Path, backend_name: str) -> None:
    with cli_server(tiny_model_dir, backend_name) as (proc, url, _):
        wait_healthy(url, headers={}, timeout=120, proc=proc)
        core = _core_of(proc)
        os.kill(proc.pid, signal.SIGKILL)
        assert _wait_gone(core, 2.0) < 2.0


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_with_requests_in_flight_drains_and_leaves_no_process(
    tiny_model_dir: Path, backend_name: str, how: signal.Signals
) -> None:
    with cli_server(tiny_model_dir, backend_name, "--served-model-name", "tiny", "--drain-timeout", "1") as (
        proc,
        url,
        log,
    ):
        wait_healthy(url, headers={}, timeout=120, proc=proc)
        family = _family(proc.pid)
        stopped_at: list[float] = []

        def stop() -> None:
            stopped_at.append(time.monotonic())
            # Ctrl-C reaches the whole process group; the core ignores it and the front end drives the shutdown.
            for p in family if how == signal.SIGINT else family[:1]:
                os.kill(p.pid, how)

        streams, _ = asyncio.run(_streams_until(url, stop, max_tokens=480))
        code = proc.wait(30)
        took = time.monotonic() - stopped_at[0]
        # After its graceful shutdown uvicorn re-raises the signal it caught: SIGTERM ends the process by that
        # signal (as uvicorn alone does), Ctrl-C ends it with 130; never the dead-core status 1.
        assert code == (-signal.SIGTERM if how == signal.SIGTERM else 130), log.read_text()
        assert took < 10, f"shutdown took {took:.1f} s"
        for p in family:
            assert _gone(p), f"process {p.pid} left behind"
        # 16 x 480 tokens outlast a 1 s drain: every stream ends whole, with an error event naming it, then [DONE]
        # (none cut off mid-body, which _streams_until would drop), and the log has no traceback.
        assert len(streams) == STREAMS
        for lines, _ in streams:
            assert lines[-1] == "[DONE]", lines[-2:]
            assert "did not finish within the 1 s drain" in json.loads(lines[-2])["error"]["message"]
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_bad_model_path_is_reported_quickly(tmp_path: Path) -> None:
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "paged_core.cli.main", "serve", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "missing" in r.stderr and "error" in r.stderr
    assert time.monotonic() - start < 30


def test_core_start_up_failure_reaches_the_user_as_its_message(tiny_model_dir: Path) -> None:
    # The path resolves, so the core process starts; the backend is unknown, which only the core finds out.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "paged_core.cli.main",
            "serve",
            str(tiny_model_dir),
            "--backend",
            "no-such-backend",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "no-such-backend" in r.stderr and "paged serve: error" in r.stderr


@pytest.fixture(scope="module")
def tp_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chat_model(tmp_path_factory.mktemp("serve-tp-model"), kv_heads=2)


def test_tensor_parallel_worker_killed_mid_stream_ends_the_core_with_the_cause(tp_model_dir: Path) -> None:
    # The front end sees a dead core, as above, but the streams and the log name the worker that died.
    _worker_killed_mid_stream(tp_model_dir)


@pytest.fixture(scope="module")
def ep_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Mixtral (4 experts, top-2) with the tiny chat model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig

    tok = AutoTokenizer.from_pretrained(save_tiny_chat_model(tmp_path_factory.mktemp("serve-ep-tok")))
    config = MixtralConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    out = tmp_path_factory.mktemp("serve-ep-model") / "tiny-moe"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_expert_parallel_worker_killed_mid_stream_is_reported_as_for_tensor_parallelism(ep_model_dir: Path) -> None:
    _worker_killed_mid_stream(ep_model_dir, "--enable-expert-parallel")


def _worker_killed_mid_stream(model_dir: Path, *flags: str) -> None:
    with cli_server(
        model_dir,
        "reference",
        "--served-model-name",
        "tiny",
        "--tensor-parallel-size",
        "2",
        "--distributed-timeout",
        "10",
        *flags,
    ) as (proc, url, log):
        wait_healthy(url, headers={}, timeout=120, proc=proc)
        family = _family(proc.pid)
        (worker,) = [p for p in family if "paged_core.engine_core.tp_worker" in " ".join(p.cmdline())]
        streams, killed_at = asyncio.run(_streams_until(url, lambda: os.kill(worker.pid, signal.SIGKILL)))
        health = httpx.get(f"{url}/health", timeout=5)
        assert len(streams) == STREAMS
        for lines, ended in streams:
            message = json.loads(lines[-2])["error"]["message"]
            assert "tensor-parallel worker rank 1" in message and "killed by SIGKILL" in message, message
            assert ended - killed_at < 5.0, f"a stream took {ended - killed_at:.2f} s to end"
        assert health.status_code == 503
        assert proc.wait(15) != 0
        assert "tensor-parallel worker rank 1" in log.read_text(), log.read_text()[-3000:]
        for p in family:
            assert _gone(p) or p.pid == worker.pid, f"process {p.pid} ({' '.join(p.cmdline())}) left behind"
