"""The server side of ``paged bench serve``: start ``paged serve`` variants as subprocesses, and stop them cleanly.

Each variant runs as ``python -m paged_core.cli.main serve`` with this
interpreter (so the same installation and ``PYTHONPATH``), on a free loopback
port, in its own session: stopping it signals the whole process group, so an
engine-core process it started goes with it (SIGTERM, then SIGKILL after a
grace period). Its output goes to a temporary log, quoted when it fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from paged_core.errors import PagedError

HOST = "127.0.0.1"
VARIANTS = ("mp", "inproc")
"""``mp``: ``paged serve`` as started by default (API server process + engine-core process);
``inproc``: ``paged serve --engine-in-process`` (the engine in the API server's process)."""
IN_PROCESS_FLAG = "--engine-in-process"
LOOPS = {"sync": "--no-async-scheduling", "async": "--async-scheduling"}
"""A variant's optional ``+LOOP`` suffix (``mp+async``): the engine core's loop, in turn or overlapped."""
STOP_GRACE_S = 20.0


class ServerError(PagedError):
    """A server variant did not start (or died): the message carries the end of its log."""


def parse_variants(text: str | None, compare_async: bool = False) -> tuple[str, ...]:
    """``"mp,inproc"`` -> ``("mp", "inproc")``; unknown names are an error naming the choices.

    A name may end in ``+sync`` or ``+async`` (the engine core's loop, see :data:`LOOPS`); ``compare_async``
    runs each plain name twice, ``NAME+sync`` then ``NAME+async``.
    """
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if compare_async:
        names = [f"{n}+{loop}" if "+" not in n else n for n in names for loop in LOOPS]
    bad = [n for n in names if not is_variant(n)]
    if bad or not names:
        choices = ", ".join(VARIANTS)
        raise ValueError(
            f"--servers takes a comma-separated list of {choices} (each may end +sync or +async), got {text!r}"
        )
    return tuple(dict.fromkeys(names))


def is_variant(name: str) -> bool:
    """``mp``, ``inproc``, or either with a ``+sync``/``+async`` suffix."""
    base, sep, loop = name.partition("+")
    return base in VARIANTS and (not sep or loop in LOOPS)


def parse_urls(text: str) -> list[tuple[str, str]]:
    """``"URL"`` or ``"NAME=URL,NAME=URL"`` -> ``[(name, url)]`` (an unnamed one is ``url``, ``url2``...)."""
    out: list[tuple[str, str]] = []
    for i, item in enumerate(p.strip() for p in text.split(",") if p.strip()):
        name, sep, url = item.partition("=")
        if not sep or "://" in name:
            name, url = ("url" if i == 0 else f"url{i + 1}"), item
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url wants http(s)://HOST:PORT, got {url!r}")
        out.append((name, url.rstrip("/")))
    if not out:
        raise ValueError("--url is empty")
    if len({n for n, _ in out}) != len(out):
        raise ValueError(f"--url names must differ: {text!r}")
    return out


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine options of ``args`` that differ from ``paged serve``'s defaults, as command-line flags.

    Built from :func:`~paged_core.cli.engine_args.add_engine_args` itself, so
    an engine option added there passes through without a change here.
    """
    from paged_core.cli.engine_args import add_engine_args

    ref = argparse.ArgumentParser(add_help=False)
    add_engine_args(ref)
    out: list[str] = []
    for action in ref._actions:  # argparse has no public iterator over a parser's options
        if not action.option_strings or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if value == action.default or value is None:
            continue
        flag = max(action.option_strings, key=len)
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(min(action.option_strings, key=len) if value else flag)  # --name / --no-name
        elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            out.append(flag)  # a switch differs from its default only when given
        elif isinstance(value, (tuple, list)):
            out += [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


def serve_has_flag(flag: str) -> bool:
    """Whether this installation's ``paged serve`` parser knows ``flag`` (asked in-process, no server started)."""
    from paged_core.cli import serve as serve_cli

    parser = argparse.ArgumentParser(add_help=False)
    serve_cli.register(parser.add_subparsers(dest="command"))
    _, unknown = parser.parse_known_args(["serve", flag])
    return flag not in unknown


def free_port() -> int:
    """A loopback port nobody listens on now (the server binds it right after; a clash shows as a failed start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def healthy(url: str, api_key: str | None = None) -> bool:
    """``GET /health`` answers 200."""
    req = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@dataclass
class ServerProcess:
    """A started variant: where it listens, how it was started, how long it took to answer ``/health``."""

    name: str
    command: list[str]
    url: str
    proc: subprocess.Popen[Any] | None = None
    log_path: str | None = None
    startup_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server's output."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "\n".join(fh.read().splitlines()[-lines:])
        except OSError:
            return ""

    def to_dict(self) -> dict[str, Any]:
        """The record kept in the report."""
        return {"url": self.url, "command": list(self.command), "startup_s": self.startup_s, "notes": list(self.notes)}


def variant_command(
    name: str, port: int, engine_flags: Sequence[str], extra: Sequence[str] = (), in_process_flag: bool | None = None
) -> tuple[list[str], list[str]]:
    """The command line of variant ``name`` on ``port``, and notes on how it differs from what was asked.

    A ``+sync``/``+async`` suffix sets the engine core's loop, after (so over) ``engine_flags``.
    """
    if not is_variant(name):
        raise ValueError(f"unknown server variant {name!r}; choose from {', '.join(VARIANTS)} (+sync or +async)")
    name, _, loop = name.partition("+")
    cmd = [
        sys.executable,
        "-m",
        "paged_core.cli.main",
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *engine_flags,
        *extra,
        *([LOOPS[loop]] if loop else []),
    ]
    notes = []
    if name == "inproc":
        if in_process_flag is None:
            in_process_flag = serve_has_flag(IN_PROCESS_FLAG)
        if in_process_flag:
            cmd.append(IN_PROCESS_FLAG)
        else:
            notes.append(f"this paged serve has no {IN_PROCESS_FLAG}: started without it (same server as mp)")
    return cmd, notes


def stop(proc: subprocess.Popen[Any], grace: float = STOP_GRACE_S) -> None:
    """End the server's whole process group: SIGTERM, then SIGKILL for what is left after ``grace`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:  # the leader may be gone while children of its group are not
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextmanager
def started(
    name: str,
    engine_flags: Sequence[str],
    extra: Sequence[str] = (),
    timeout: float = 600.0,
    api_key: str | None = None,
    poll: float = 0.25,
) -> Iterator[ServerProcess]:
    """Start variant ``name``, wait (at most ``timeout`` s) for ``/health`` 200, yield it, always stop it."""
    port = free_port()
    cmd, notes = variant_command(name, port, engine_flags, extra)
    server = ServerProcess(name=name, command=cmd, url=f"http://{HOST}:{port}", notes=notes)
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error")}
    with tempfile.NamedTemporaryFile("w", prefix=f"paged-bench-serve-{name}-", suffix=".log", delete=False) as log:
        server.log_path = log.name
        t0 = time.monotonic()
        server.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while not healthy(server.url, api_key):
            if server.proc.poll() is not None:
                raise ServerError(
                    f"server {name} exited with status {server.proc.returncode} before /health "
                    f"answered; its log ends:\n{server.log_tail()}"
                )
            if time.monotonic() - t0 > timeout:
                raise ServerError(
                    f"server {name}: /health did not answer within {timeout:.0f} s; its log ends:\n{server.log_tail()}"
                )
            time.sleep(poll)
        server.startup_s = time.monotonic() - t0
        yield server
        if server.proc.poll() is not None:
            raise ServerError(
                f"server {name} died during the run (status {server.proc.returncode}); its log ends:\n"
                f"{server.log_tail()}"
            )
    finally:
        stop(server.proc)
        os.unlink(server.log_path)
