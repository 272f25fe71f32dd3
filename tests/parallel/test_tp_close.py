"""Closing a tensor-parallel engine is quiet: every worker quits before rank 0 takes the rendezvous store down.

Were the store to go first, an idle worker's heartbeat would write into it, and torch prints a C++
stack trace for each failed store call (then the worker's own traceback follows).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paged_core.parallel.rendezvous import free_port

pytestmark = pytest.mark.serial  # two ranks per engine

TESTS = str(Path(__file__).resolve().parents[1])

RANK0 = """
import sys, time
sys.path.insert(0, {tests!r})
from paged_core import LLM, SamplingParams
from parallel.tp_helpers import ENGINE
llm = LLM({model!r}, tensor_parallel_size=2, distributed_init={init!r}, **ENGINE)
llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4), use_tqdm=False)
time.sleep(1.2)  # idle for two heartbeats: the worker is beating into the store when the engine goes
{close}
print("DONE", flush=True)
"""

NOISE = ("Traceback", "frame #", "TCPStore", "ERROR", "Exception raised")


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(mark in line for mark in NOISE)]


def _env(rank: int | None = None, port: int = 0) -> dict[str, str]:
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    if rank is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_WORLD_SIZE="2")
    return env


@pytest.mark.parametrize("close", ["llm.close()", "pass  # dropped: the interpreter's exit ends it"])
def test_closing_a_local_tensor_parallel_engine_prints_no_traceback(tiny_llama: Path, close: str) -> None:
    script = RANK0.format(tests=TESTS, model=str(tiny_llama), init="local", close=close)
    run = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and "DONE" in run.stdout, run.stderr[-3000:]
    assert _noise(run.stderr) == [], run.stderr[-3000:]


def test_closing_an_env_launched_engine_lets_its_remote_worker_go_quietly(tiny_llama: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "paged_core.cli.main", "worker", "--timeout", "120"]
    worker = subprocess.Popen(command, env=_env(1, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        script = RANK0.format(tests=TESTS, model=str(tiny_llama), init="env", close="llm.close()")
        run = subprocess.run(
            [sys.executable, "-c", script], env=_env(0, port), capture_output=True, text=True, timeout=240
        )
        worker_code = worker.wait(30)
    finally:
        worker.kill()
    output = worker.stdout.read() if worker.stdout else ""
    assert run.returncode == 0 and "DONE" in run.stdout, run.stderr[-3000:]
    assert _noise(run.stderr) == [], run.stderr[-3000:]
    assert worker_code == 0 and _noise(output) == [], output[-3000:]
