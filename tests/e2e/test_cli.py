"""``paged generate`` and ``paged chat`` on the embedded model, as a user runs them (no flags needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .e2e_helpers import ACTIVATIONS_ENV

PAGED = str(Path(sys.executable).parent / "paged")


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # Without the exact-activation switch the parity battery sets (conftest): the CLI runs as a user's does.
    env = {k: v for k, v in os.environ.items() if k != ACTIVATIONS_ENV} | {"TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([PAGED, *args], input=stdin, capture_output=True, text=True, timeout=600, env=env)


def test_generate_answers_the_capital_of_france() -> None:
    proc = _run(["generate", "What is the capital of France?", "--kv-cache-memory", "64MiB"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Paris" in proc.stdout


def test_chat_streams_replies_and_keeps_history() -> None:
    proc = _run(
        ["chat", "--max-tokens", "24", "--kv-cache-memory", "64MiB"],
        stdin="What is the capital of France?\n/reset\nSay hello.\n",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) >= 2 and "Paris" in lines[0]


def test_generate_reports_bad_options_by_name() -> None:
    proc = _run(["generate", "hi", "--top-p", "0", "--kv-cache-memory", "64MiB"])
    assert proc.returncode == 1
    assert "top_p" in proc.stderr and "Traceback" not in proc.stderr
