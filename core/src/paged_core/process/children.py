"""Take a child process down and say how it ended (engine cores, tensor-parallel workers)."""

from __future__ import annotations

import logging
import signal
import subprocess

log = logging.getLogger("paged.engine")


def describe_exit(code: int | None) -> str:
    """``exit code 1`` or ``killed by SIGKILL``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def wait_or_kill(proc: subprocess.Popen[bytes], timeout: float, what: str = "engine core") -> None:
    """Wait up to ``timeout`` for ``proc`` to exit, then SIGTERM it, then (after 2 s) SIGKILL it."""
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        log.warning("%s (pid %d) did not exit within %.1f s; terminating it", what, proc.pid, timeout)
    proc.terminate()
    try:
        proc.wait(2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
