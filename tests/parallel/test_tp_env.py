"""Two launches on loopback playing two machines: rank 0 (an engine) and ``paged worker``, via torchrun's variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paged_core import LLM
from paged_core.parallel.rendezvous import free_port

from .tp_helpers import ENGINE, workload

pytestmark = pytest.mark.serial  # ranks launched apart, and heartbeat timeouts

RANK0 = """
import json, sys
sys.path.insert(0, {tests!r})
from paged_core import LLM
from parallel.tp_helpers import ENGINE, workload
prompts, params = workload()
with LLM({model!r}, tensor_parallel_size=2, distributed_init="env", **ENGINE) as llm:
    outs = llm.generate(prompts, params, use_tqdm=False)
print("RESULT " + json.dumps([[c.token_ids for c in o.outputs] for o in outs]))
"""


def _env(rank: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "RANK": str(rank),
        "LOCAL_WORLD_SIZE": "2",
        "TRANSFORMERS_VERBOSITY": "error",
    }


def test_rank_0_and_a_paged_worker_launched_apart_match_one_process(tiny_llama: Path) -> None:
    port = free_port()
    tests = str(Path(__file__).resolve().parents[1])
    # The worker first, as on a second machine that comes up early: it waits for rank 0's store.
    worker = subprocess.Popen(
        [sys.executable, "-m", "paged_core.cli.main", "worker", "--timeout", "120"],
        env=_env(1, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        rank0 = subprocess.run(
            [sys.executable, "-c", RANK0.format(tests=tests, model=str(tiny_llama))],
            env=_env(0, port),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert rank0.returncode == 0, rank0.stderr[-3000:]
        worker_code = worker.wait(30)
    finally:
        worker.kill()
    assert worker_code == 0, worker.stdout.read() if worker.stdout else ""
    line = next(x for x in rank0.stdout.splitlines() if x.startswith("RESULT "))
    two = json.loads(line.removeprefix("RESULT "))
    prompts, params = workload()
    with LLM(str(tiny_llama), **ENGINE) as llm:
        one = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert two == one


def _worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paged_core.cli.main", "worker", "--timeout", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_paged_worker_refuses_a_launch_it_cannot_join() -> None:
    bare = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    r = _worker(bare)
    assert r.returncode == 1 and "missing: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK" in r.stderr, r.stderr
    r = _worker(_env(0, free_port()))
    assert r.returncode == 1 and "RANK=0 is the engine core's rank" in r.stderr, r.stderr
    r = _worker(_env(1, free_port()))  # nobody hosts the store: refused after the timeout, naming where it looked
    assert r.returncode == 1 and "cannot reach the rendezvous store at 127.0.0.1" in r.stderr, r.stderr


def test_rank_0_without_its_variables_is_refused(tiny_llama: Path) -> None:
    from paged_core.errors import ConfigError

    saved = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK") if k in os.environ}
    try:
        with pytest.raises(ConfigError, match="missing: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK"):
            LLM(str(tiny_llama), tensor_parallel_size=2, distributed_init="env", **ENGINE)
    finally:
        os.environ.update(saved)


IDLE_RANK0 = """
import sys, time
sys.path.insert(0, {tests!r})
from paged_core import LLM, SamplingParams
from parallel.tp_helpers import ENGINE
with LLM({model!r}, tensor_parallel_size=2, distributed_init="env", **{{**ENGINE, "distributed_timeout": 3.0}}) as llm:
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
    print("READY", flush=True)
    sys.stdin.readline()  # the test kills the worker now; the engine is idle
    start = time.monotonic()
    while (cause := llm.engine.core.failure()) is None and time.monotonic() - start < 30:
        time.sleep(0.2)
    print(f"FAILURE {{time.monotonic() - start:.1f}} {{cause}}", flush=True)
"""


def test_a_remote_worker_lost_while_idle_is_noticed_by_its_heartbeat(tiny_llama: Path) -> None:
    port = free_port()
    tests = str(Path(__file__).resolve().parents[1])
    worker = subprocess.Popen(
        [sys.executable, "-m", "paged_core.cli.main", "worker", "--timeout", "120"],
        env=_env(1, port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rank0 = subprocess.Popen(
        [sys.executable, "-c", IDLE_RANK0.format(tests=tests, model=str(tiny_llama))],
        env=_env(0, port),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank0.stdout is not None and rank0.stdin is not None
        assert rank0.stdout.readline().strip() == "READY"
        worker.kill()  # not rank 0's child: only its heartbeat can tell
        worker.wait()
        rank0.stdin.write("go\n")
        rank0.stdin.flush()
        line = rank0.stdout.readline()
        rank0.wait(60)
    finally:
        worker.kill()
        rank0.kill()
    assert line.startswith("FAILURE "), line
    took = float(line.split()[1])
    assert "worker rank 1 stopped answering: no heartbeat" in line and took < 3.0 + 3.0, line
