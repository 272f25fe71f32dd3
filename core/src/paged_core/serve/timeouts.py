"""Connection timeouts uvicorn lacks: idle from the first byte, header read, and body read.

uvicorn (0.54, h11) arms ``timeout_keep_alive`` only after a response: a
connection that never sends a byte, or sends part of its headers (any byte
cancels the timer), or trickles its body, is kept for ever. The protocol
class made by :func:`timeout_protocol` closes such connections:

* idle: no request under way and no byte of the next one for ``idle`` seconds
  (uvicorn's keep-alive timer, also armed when the connection opens);
* headers: a request's headers not complete ``headers`` seconds after its
  first byte (answered ``408``);
* body: its body not complete ``body`` seconds after its headers (answered
  ``408`` unless a response has started; the app sees a disconnect).

It also turns Nagle's algorithm off on every connection (see :func:`_no_delay`).

It is always the h11 implementation: ``httptools`` is not a dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("paged.serve")


def _timeout_response(what: str, seconds: float) -> bytes:
    body = f"{what} not received within {seconds:g} s\n".encode()
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    return head + body


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send small writes at once. asyncio does so only for sockets whose ``proto`` is TCP, and a socket made as
    ``socket(AF_INET, SOCK_STREAM)`` (``--fd``, uvicorn's workers, a test's pre-bound socket) has proto 0: h11
    writes a response's head and body separately, so Nagle held every body back for the client's delayed ACK
    (~40 ms per keep-alive request, /health included)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class TimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus header- and body-read timeouts (set by :func:`timeout_protocol`)."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: str | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the idle timer at once (uvicorn's own starts only after a first response); turn off Nagle."""
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
        _no_delay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the phase timer with the connection."""
        self._set_phase(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed h11, then time whatever phase the request is in now."""
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        """A response went out: pipelined bytes may have started the next request's header phase."""
        super().on_response_complete()
        self._update()

    def _update(self) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._set_phase("body")
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            self._set_phase("headers")  # part of a request line or headers is buffered
        else:
            self._set_phase(None)

    def _set_phase(self, phase: str | None) -> None:
        if phase == self._phase:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = phase
        if phase is not None and not self.transport.is_closing():
            seconds = self.header_timeout if phase == "headers" else self.body_timeout
            self._timer = self.loop.call_later(seconds, self._expire, phase, seconds)

    def _expire(self, phase: str, seconds: float) -> None:
        self._timer = None
        self._phase = None
        if self.transport.is_closing():
            return
        log.info("closing connection from %s: request %s not received within %g s", self.client, phase, seconds)
        cycle = self.cycle
        started = cycle is not None and phase == "body" and cycle.response_started
        if cycle is not None and phase == "body":
            cycle.disconnected = True  # the app's receive() now reports a disconnect and its sends are dropped
            cycle.message_event.set()
        if not started:
            self.transport.write(
                _timeout_response("request headers" if phase == "headers" else "request body", seconds)
            )
        self.transport.close()


def timeout_protocol(header_timeout: float, body_timeout: float) -> type[TimeoutH11Protocol]:
    """A :class:`TimeoutH11Protocol` subclass with these timeouts, for ``uvicorn.Config(http=...)``."""
    return type(
        "ServeH11Protocol", (TimeoutH11Protocol,), {"header_timeout": header_timeout, "body_timeout": body_timeout}
    )


def uvicorn_options(idle_timeout: float, header_timeout: float, body_timeout: float) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that apply the three connection timeouts."""
    return {"http": timeout_protocol(header_timeout, body_timeout), "timeout_keep_alive": idle_timeout}
