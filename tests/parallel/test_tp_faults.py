"""A tensor-parallel worker that dies or stalls ends the engine with the cause, within the timeout; nothing is left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from paged_core import LLM, SamplingParams
from paged_core.errors import DistributedError, UnsupportedConfigError

from .tp_helpers import ENGINE, worker_pids

pytestmark = pytest.mark.serial  # two ranks, and bounds on how fast a lost rank is noticed

PARAMS = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
PROMPTS = [[5 + (3 * i + j) % 400 for j in range(20)] for i in range(4)]


def _step_until_failure(llm: LLM, limit: float) -> tuple[DistributedError, float]:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        try:
            llm.engine.step()
        except DistributedError as exc:
            return exc, time.monotonic() - start
    raise AssertionError(f"no DistributedError within {limit} s")


def _streaming(llm: LLM) -> int:
    """Requests mid-stream: added, a few steps run; the worker's pid."""
    for prompt in PROMPTS:
        llm.engine.add_request(prompt, PARAMS)
    for _ in range(3):
        llm.engine.step()
    (pid,) = worker_pids()
    return pid


def test_a_killed_worker_ends_the_engine_naming_it(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), tensor_parallel_size=2, **ENGINE)
    try:
        with pytest.raises(UnsupportedConfigError, match="serves one engine"):  # its workers mirror this engine
            llm.reconfigured(num_blocks=30)
        pid = _streaming(llm)
        os.kill(pid, signal.SIGKILL)
        exc, took = _step_until_failure(llm, 30.0)
        assert "worker rank 1" in str(exc) and "SIGKILL" in str(exc), exc
        assert took < 5.0, f"noticed after {took:.1f} s"
    finally:
        llm.close()
    assert worker_pids() == []


def test_a_stalled_collective_times_out_with_the_cause(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), tensor_parallel_size=2, **{**ENGINE, "distributed_timeout": 4.0})
    try:
        pid = _streaming(llm)
        os.kill(pid, signal.SIGSTOP)  # alive but silent: rank 0's next all-reduce waits for it
        try:
            exc, took = _step_until_failure(llm, 30.0)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "timed out after 4 s" in str(exc), exc
        assert took < 4.0 + 5.0, f"took {took:.1f} s with a 4 s timeout"
    finally:
        start = time.monotonic()
        llm.close()
        assert time.monotonic() - start < 10.0
    assert worker_pids() == []
