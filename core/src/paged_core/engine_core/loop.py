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

from paged_core.engine_core.channels import CoreChannel, SocketChannel
from paged_core.engine_core.messages import (
    CoreAbort,
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
from paged_core.engine_core.wire_checks import check_wire_request
from paged_core.errors import DistributedError
from paged_core.process.parent import die_with_parent

log = logging.getLogger("paged.core")

IDLE_POLL_MS = 1000
"""How long an idle core blocks before checking that its parent is alive."""


class CoreLoop:
    """The message loop around one :class:`EngineCore`, over a channel to its front end.

    A core process runs it over its sockets (:class:`SocketChannel`, in :func:`main`); the server's in-process
    core runs it on a thread over queues (:class:`~paged_core.clients.core_thread.CoreThread`). Each turn: read
    every queued message, step while requests are unfinished, send each step's outputs with the adds it refused.
    Adds are never answered on their own, so a front end can stream a request as soon as it is sent.
    """

    def __init__(self, core: Any, channel: CoreChannel, parent_pid: int | None = None) -> None:
        self.core = core
        self.channel = channel
        self.parent_pid = parent_pid
        self.running = True
        self._limits: tuple[int, int] | None = None
        """(vocab_size, max_num_seqs) for re-checking requests off an untrusted channel (read on first use)."""

    def send(self, message: Any) -> None:
        self.channel.send(message)

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
                self.channel.wait(IDLE_POLL_MS)
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                log.warning("the front end (pid %d) is gone; engine core exiting", self.parent_pid)
                return
            if failure is not None and (dead := failure()) is not None:
                raise DistributedError(dead)
            refused: dict[str, str] = {}
            changed = self.drain(refused)
            if not self.running:
                return
            if core.has_unfinished_requests():
                outputs = core.step()
                if refused:
                    outputs.refused = {**outputs.refused, **refused}
                self.send(outputs)
            elif changed or refused:
                # An idle core still reports what aborts freed, and the adds it refused.
                self.send(CoreOutputs([], core.stats(), refused=refused))

    def drain(self, refused: dict[str, str]) -> bool:
        """Apply every queued message (refused adds into ``refused``); True if any changed the core's state."""
        changed = False
        while self.running:
            message = self.channel.receive()
            if message is None:
                break
            changed |= self.handle(message, refused)
        return changed

    def add(self, request: CoreRequest, refused: dict[str, str]) -> bool:
        try:
            if not self.channel.trusted:
                request = check_wire_request(request, *self._wire_limits())
            self.core.add_request(request)
        except Exception as exc:  # refused (or worse): this request alone, with the reason
            refused[request.request_id] = str(exc) or type(exc).__name__
            return False
        return True

    def _wire_limits(self) -> tuple[int, int]:
        if self._limits is None:
            facts = self.core.facts()
            self._limits = (facts.vocab_size, facts.max_num_seqs)
        return self._limits

    def handle(self, message: ToCore, refused: dict[str, str]) -> bool:
        """Apply one message; True if it changed the core's state."""
        core = self.core
        if isinstance(message, CoreRequest):
            return self.add(message, refused)
        if isinstance(message, CoreRequests):
            return any([self.add(r, refused) for r in message.requests])
        if isinstance(message, CoreAbort):
            core.abort(message)
            return True
        if isinstance(message, CoreUtility):
            try:
                dropped = message.method == "dropped_messages"
                result = self.channel.dropped if dropped else core.call(message.method, *message.args)
                self.send(CoreUtilityResult(message.call_id, result))
            except Exception as exc:
                self.send(CoreUtilityResult(message.call_id, None, f"{type(exc).__name__}: {exc}"))
            return message.method == "reset_prefix_cache"
        if isinstance(message, CoreShutdown):
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
        loop = CoreLoop(core, SocketChannel(inbox, outbox), parent)
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
