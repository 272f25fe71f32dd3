"""CoreProcess: start an engine core in a child process, hand-shake, talk to it, and take it down.

Each instance gets its own temporary directory (mode 0700) holding the two ``ipc://`` sockets, the
config and the options: never a fixed name or port. The front end binds both sockets (PUSH ``in``,
PULL ``out``); the child connects. Start the process, do other work (load the tokenizer), then
:meth:`CoreProcess.wait_ready`: a start-up failure reaches the caller as :class:`EngineStartError`
carrying the child's own message; a child that dies without one is reported with its exit status.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq

from paged_core.engine_config import EngineConfig
from paged_core.engine_core.messages import CoreFacts, CoreFailed, CoreReady, CoreShutdown, FromCore, SchedulerStats
from paged_core.errors import EngineDeadError, PagedError
from paged_core.process.children import describe_exit, wait_or_kill
from paged_core.process.runtime import child_environ

log = logging.getLogger("paged.engine")

POLL_MS = 100
"""How often a waiting reader checks that the core is still alive."""


class EngineStartError(PagedError, RuntimeError):
    """The engine core could not start; the message is the core's own (a bad model path, say)."""


class CoreProcess:
    """One engine-core child process and the sockets to it (use from one thread per socket)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        verbose: bool | None = None,
        startup_timeout: float | None = None,
        environ: dict[str, str] | None = None,
    ):
        self.dir = Path(tempfile.mkdtemp(prefix="paged-core-"))
        self.ctx = zmq.Context()
        self.to_core = self.ctx.socket(zmq.PUSH)
        self.from_core = self.ctx.socket(zmq.PULL)
        self.to_core.bind(f"ipc://{self.dir / 'in'}")
        self.from_core.bind(f"ipc://{self.dir / 'out'}")
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(FromCore)
        self.proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        verbose = log.isEnabledFor(logging.INFO) if verbose is None else verbose
        (self.dir / "config.json").write_bytes(msgspec.json.encode(config))
        (self.dir / "options.json").write_text(
            msgspec.json.encode({"parent_pid": os.getpid(), "verbose": verbose}).decode()
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "paged_core.engine_core.loop", str(self.dir)],
                stdin=subprocess.DEVNULL,
                env={**child_environ(), **(environ or {})},
            )
        except BaseException:
            self.close(timeout=2.0)
            raise
        self.startup_timeout = startup_timeout
        self.facts: CoreFacts | None = None
        self.stats = SchedulerStats()
        self.dead_cause: str | None = None
        """What the core said before it ended (its :class:`CoreFailed` after start-up)."""

    def wait_ready(self) -> CoreFacts:
        """Block until the core has started (its facts) or failed (:class:`EngineStartError`, the process reaped)."""
        if self.facts is None:
            try:
                ready = self._handshake(self.startup_timeout)
            except BaseException:
                self.close(timeout=2.0)
                raise
            self.facts, self.stats = ready.facts, ready.stats
        return self.facts

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _handshake(self, timeout: float | None) -> CoreReady:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            msg = self.recv(POLL_MS)
            if isinstance(msg, CoreReady):
                return msg
            if isinstance(msg, CoreFailed):
                raise EngineStartError(msg.message)
            if deadline is not None and time.monotonic() > deadline:
                raise EngineStartError(f"the engine core did not start within {timeout:.0f} s")

    # ---- messages -------------------------------------------------------
    def send(self, message: Any) -> None:
        """Send one message to the core (call from one thread only)."""
        if self._closed:
            raise EngineDeadError("the engine core is shut down")
        self.to_core.send(self.encoder.encode(message), copy=False)

    def recv(self, timeout_ms: int) -> FromCore | None:
        """The next message, or None after ``timeout_ms``; :class:`EngineDeadError` once the core has died.

        A :class:`CoreFailed` after start-up is the core's last word (a tensor-parallel worker died, a
        collective timed out): its cause is kept and named when the core's exit is reported.
        """
        if self.from_core.poll(timeout_ms):
            msg = self.decoder.decode(self.from_core.recv(copy=False).buffer)
            if isinstance(msg, CoreFailed) and self.facts is not None:
                self.dead_cause = msg.message
                return None
            return msg
        if not self.alive:
            cause = f": {self.dead_cause}" if self.dead_cause else ""
            raise EngineDeadError(f"the engine core process died ({describe_exit(self.returncode)}){cause}")
        return None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    # ---- shutdown -------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Ask the core to exit, wait up to ``timeout``, then terminate and kill; always releases everything."""
        if self._closed:
            return
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                self.to_core.send(self.encoder.encode(CoreShutdown()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            wait_or_kill(proc, timeout)
        self._closed = True
        # Sockets before the context: terminating a context with open sockets blocks.
        self.to_core.close(linger=0)
        self.from_core.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)
