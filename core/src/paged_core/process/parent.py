"""Tie a child process's life to its parent's (the engine core and tensor-parallel workers call this first)."""

from __future__ import annotations

import signal
import sys


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere).

    Linux ties this to the parent *thread* that started the process: start cores from a thread that
    lives as long as they should (``paged serve`` and ``LLM`` start them from the caller's thread).
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
