"""The engine-core process: ``python -m paged_core.engine_core.loop DIR`` (started by :class:`CoreProcess`).

It reads its :class:`EngineConfig` from ``DIR/config.json``, connects to the front end's two
``ipc://`` sockets in ``DIR`` (``in``: messages to the core, ``out``: messages from it), builds the
:class:`EngineCore`, answers :class:`CoreReady` or :class:`CoreFailed`, then loops: read every
queued message, step while requests are unfinished, send each step's outputs. An idle core blocks
in ``poll`` (it never spins). It exits on :class:`CoreShutdown`, on SIGTERM, and when its parent
dies (``PR_SET_PDEATHSIG`` on Linux, plus a parent-pid check every second elsewhere). SIGINT is
ignored: Ctrl-C reaches the whole process group, and the front end drives the shutdown.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import zmq

from paged_core.engine_core.messages import (
    CoreAbort,
    CoreAdmission,
    CoreFailed,
    CoreOutputs,
    CoreReady,
    CoreRequest,
    CoreRequests,
    CoreShutdown,
    CoreUtility,
    CoreUtilityResult,
    ToCore,
)
from paged_core.errors import DistributedError
from paged_core.process.parent import die_with_parent

log = logging.getLogger("paged.core")

MAX_MESSAGE_BYTES = 16 << 20
"""Largest message the core decodes; a bigger one is dropped and logged (the front end bounds requests far below)."""
IDLE_POLL_MS = 1000
"""How long an idle core blocks before checking that its parent is alive."""


class CoreLoop:
    """The message loop around one :class:`EngineCore` (separate from :func:`main` so tests can drive it)."""

    def __init__(self, core: Any, inbox: zmq.Socket[Any], outbox: zmq.Socket[Any], parent_pid: int | None) -> None:
        self.core = core
        self.inbox = inbox
        self.outbox = outbox
        self.parent_pid = parent_pid
        self.running = True
        self.dropped = 0
        """Messages dropped as malformed or oversized (answered to the utility call ``dropped_messages``)."""
        self.decoder = msgspec.msgpack.Decoder(ToCore)
        self.encoder = msgspec.msgpack.Encoder()
        self.poller = zmq.Poller()
        self.poller.register(inbox, zmq.POLLIN)

    def send(self, message: Any) -> None:
        self.outbox.send(self.encoder.encode(message), copy=False)

    def run(self) -> None:
        """Serve until shutdown, SIGTERM or the parent's death.

        A :class:`DistributedError` (a tensor-parallel worker died, a collective timed out) ends the
        loop: the cause goes to the front end as :class:`CoreFailed` first, then it is re-raised.
        """
        try:
            self._run()
        except DistributedError as exc:
            self.send(CoreFailed(str(exc), type(exc).__name__))
            raise

    def _run(self) -> None:
        core = self.core
        failure = getattr(core, "failure", None)
        while self.running:
            if not core.has_unfinished_requests():
                self.poller.poll(IDLE_POLL_MS)
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                log.warning("the front end (pid %d) is gone; engine core exiting", self.parent_pid)
                return
            if failure is not None and (dead := failure()) is not None:
                raise DistributedError(dead)
            changed = self.drain()
            if not self.running:
                return
            if core.has_unfinished_requests():
                self.send(core.step())
            elif changed:
                self.send(CoreOutputs([], core.stats()))  # an idle core still reports what aborts freed

    def drain(self) -> bool:
        """Apply every queued message; True if any changed the core's state."""
        changed = False
        admission = CoreAdmission([], {})
        while True:
            try:
                frame = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            changed |= self.handle(frame, admission)
            if not self.running:
                break
        if admission.accepted or admission.rejected:
            self.send(admission)
        return changed

    def add(self, request: CoreRequest, admission: CoreAdmission) -> bool:
        try:
            self.core.add_request(request)
        except Exception as exc:  # refused (or worse): this request alone, with the reason
            admission.rejected[request.request_id] = str(exc) or type(exc).__name__
            return False
        admission.accepted.append(request.request_id)
        return True

    def handle(self, frame: Any, admission: CoreAdmission) -> bool:
        """One message; a malformed or oversized one is dropped and logged, and everyone else is served."""
        size = len(frame.buffer)
        if size > MAX_MESSAGE_BYTES:
            log.error("dropped a %d-byte message on the engine socket (limit %d bytes)", size, MAX_MESSAGE_BYTES)
            self.dropped += 1
            return False
        try:
            msg = self.decoder.decode(frame.buffer)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
            log.error("dropped a malformed %d-byte message on the engine socket: %s", size, exc)
            self.dropped += 1
            return False
        core = self.core
        if isinstance(msg, CoreRequest):
            return self.add(msg, admission)
        if isinstance(msg, CoreRequests):
            return any([self.add(r, admission) for r in msg.requests])
        if isinstance(msg, CoreAbort):
            core.abort(msg)
            return True
        if isinstance(msg, CoreUtility):
            try:
                result = self.dropped if msg.method == "dropped_messages" else core.call(msg.method)
                self.send(CoreUtilityResult(msg.call_id, result))
            except Exception as exc:
                self.send(CoreUtilityResult(msg.call_id, None, f"{type(exc).__name__}: {exc}"))
            return msg.method == "reset_prefix_cache"
        if isinstance(msg, CoreShutdown):
            self.running = False
        return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process; returns its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    directory = Path(argv[0])
    options = json.loads((directory / "options.json").read_text())
    parent = int(options["parent_pid"])
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from paged_core.process.logs import setup_logging
    from paged_core.process.runtime import adopt

    adopt()  # started with the front end's tcmalloc and Intel OpenMP preloaded; keep them from our children

    setup_logging(bool(options.get("verbose")))
    from paged_core.parallel.placement import dp_slot

    if dp_slot()[1] > 1:  # one of several cores on this machine: its share of the threads (TP divides further)
        import torch

        from paged_core.parallel.group import threads_per_rank

        torch.set_num_threads(threads_per_rank(1))
    ctx = zmq.Context()
    outbox = ctx.socket(zmq.PUSH)
    inbox = ctx.socket(zmq.PULL)
    outbox.connect(f"ipc://{directory / 'out'}")
    inbox.connect(f"ipc://{directory / 'in'}")
    loop: CoreLoop | None = None

    def on_term(signum: int, frame: object) -> None:
        if loop is not None:
            loop.running = False
        else:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        from paged_core.engine_config import EngineConfig
        from paged_core.engine_core.core import EngineCore

        try:
            config = msgspec.json.decode((directory / "config.json").read_bytes(), type=EngineConfig)
            core = EngineCore(config)
        except Exception as exc:
            log.debug("engine core start-up failed", exc_info=True)
            encoder = msgspec.msgpack.Encoder()
            outbox.send(encoder.encode(CoreFailed(str(exc) or type(exc).__name__, type(exc).__name__)))
            return 1
        loop = CoreLoop(core, inbox, outbox, parent)
        loop.send(CoreReady(core.facts(), core.stats()))
        try:
            loop.run()
        finally:
            core.close()
    except DistributedError as exc:
        log.error("engine core ends: %s", exc)
        code = 1
    except Exception:
        log.exception("engine core died")
        code = 1
    finally:
        # Sockets first, then the context (terminating a context with open sockets blocks).
        outbox.close(linger=1000)
        inbox.close(linger=0)
        ctx.term()
    return code


if __name__ == "__main__":
    sys.exit(main())
