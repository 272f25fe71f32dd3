"""describe_exit and wait_or_kill: how a child ended, and taking down one that will not exit."""

from __future__ import annotations

import signal
import subprocess
import sys

from paged_core.process.children import describe_exit, wait_or_kill


def test_describe_exit_names_code_signal_and_running() -> None:
    assert describe_exit(None) == "still running"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-int(signal.SIGKILL)) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"


def test_wait_or_kill_terminates_a_child_that_outlives_the_timeout() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    wait_or_kill(proc, 0.1, "sleeper")
    assert proc.returncode == -int(signal.SIGTERM)


def test_wait_or_kill_returns_once_the_child_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_or_kill(proc, 30.0)
    assert proc.returncode == 0
