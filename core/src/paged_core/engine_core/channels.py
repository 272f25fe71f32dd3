"""The core's end of its link to a front end: a socket to another process, or queues within this process.

:class:`~paged_core.engine_core.loop.CoreLoop` runs over either. Both carry the messages of
:mod:`paged_core.engine_core.messages`; the socket encodes them (msgpack) and the queues hand over the objects
themselves. Only the socket is :attr:`~CoreChannel.trusted` ``False``: what comes off it is decoded with a size
limit, malformed messages are dropped (and counted), and requests are re-checked before the core computes with them.
"""

from __future__ import annotations

import logging
import queue
from typing import Any, Protocol

import msgspec
import zmq

from paged_core.engine_core.messages import FromCore, ToCore

log = logging.getLogger("paged.core")

MAX_MESSAGE_BYTES = 16 << 20
"""Largest message the core decodes; a bigger one is dropped and logged (the front end bounds requests far below)."""


class CoreChannel(Protocol):
    """What :class:`~paged_core.engine_core.loop.CoreLoop` reads from and writes to."""

    trusted: bool
    """True when the front end is in this process and validated what it sends (nothing is checked again)."""
    dropped: int
    """Messages dropped as malformed or oversized."""

    def wait(self, timeout_ms: int) -> None:
        """Block until a message may be waiting, or ``timeout_ms`` passed."""

    def receive(self) -> ToCore | None:
        """The next message without blocking; None when none is waiting."""

    def send(self, message: FromCore) -> None:
        """Send one message to the front end."""


class SocketChannel:
    """A core process's two zmq sockets (PULL ``inbox``, PUSH ``outbox``); see the module docstring."""

    trusted = False

    def __init__(self, inbox: zmq.Socket[Any], outbox: zmq.Socket[Any]) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.dropped = 0
        self.decoder = msgspec.msgpack.Decoder(ToCore)
        self.encoder = msgspec.msgpack.Encoder()
        self.poller = zmq.Poller()
        self.poller.register(inbox, zmq.POLLIN)

    def wait(self, timeout_ms: int) -> None:
        self.poller.poll(timeout_ms)

    def receive(self) -> ToCore | None:
        while True:
            try:
                frame = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            message = self._decode(frame)
            if message is not None:
                return message

    def _decode(self, frame: Any) -> ToCore | None:
        """One frame as a message; a malformed or oversized one is dropped and logged (everyone else is served)."""
        size = len(frame.buffer)
        if size > MAX_MESSAGE_BYTES:
            log.error("dropped a %d-byte message on the engine socket (limit %d bytes)", size, MAX_MESSAGE_BYTES)
            self.dropped += 1
            return None
        try:
            message: ToCore = self.decoder.decode(frame.buffer)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
            log.error("dropped a malformed %d-byte message on the engine socket: %s", size, exc)
            self.dropped += 1
            return None
        return message

    def send(self, message: FromCore) -> None:
        self.outbox.send(self.encoder.encode(message), copy=False)


class QueueChannel:
    """A core thread's queues: the front end puts messages on ``inbox`` and takes the core's from ``outbox``."""

    trusted = True

    def __init__(self) -> None:
        self.inbox: queue.Queue[ToCore] = queue.Queue()
        self.outbox: queue.Queue[FromCore] = queue.Queue()
        self.dropped = 0
        self._next: ToCore | None = None
        """A message :meth:`wait` took off the queue, handed out first by :meth:`receive`."""

    def wait(self, timeout_ms: int) -> None:
        if self._next is None:
            try:
                self._next = self.inbox.get(timeout=timeout_ms / 1000)
            except queue.Empty:
                pass

    def receive(self) -> ToCore | None:
        if self._next is not None:
            message, self._next = self._next, None
            return message
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return None

    def send(self, message: FromCore) -> None:
        self.outbox.put(message)
