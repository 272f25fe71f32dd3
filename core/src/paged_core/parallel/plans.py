"""The step-plan channel from rank 0 to the workers: one zmq PUSH per worker, msgspec-encoded plans.

Plans travel on sockets, not collectives: an idle engine sends nothing for as long as it likes,
while a worker waiting in a collective would time out. Rank 0 binds one PUSH socket per worker
(loopback for ``local``, every interface for ``env``, where the ranks' network is trusted as
gloo's is) and publishes its address in the rendezvous store; each worker connects a PULL.
"""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

from paged_core.parallel.group import TPGroup
from paged_core.sched.output import SchedulerOutput

STEP, QUIT = b"s", b"q"
POLL_MS = 1000
"""How long a waiting worker blocks before checking that rank 0 is still there."""


def _key(rank: int) -> str:
    return f"paged/plans/{rank}"


class PlanSender:
    """Rank 0's end: sends every step's :class:`SchedulerOutput` to each worker."""

    def __init__(self, group: TPGroup, addr: str, local: bool) -> None:
        self.ctx = zmq.Context()
        self.sockets: list[zmq.Socket[Any]] = []
        self.encoder = msgspec.msgpack.Encoder()
        for rank in range(1, group.world_size):
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            port = sock.bind_to_random_port("tcp://127.0.0.1" if local else "tcp://*")
            self.sockets.append(sock)
            host = f"[{addr}]" if ":" in addr else addr
            group.store.set(_key(rank), f"tcp://{host}:{port}")

    def send(self, out: SchedulerOutput) -> None:
        payload = self.encoder.encode(out)
        for sock in self.sockets:
            sock.send_multipart([STEP, payload], copy=False)

    def close(self) -> None:
        for sock in self.sockets:
            try:
                sock.send_multipart([QUIT, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            sock.close(linger=200)
        self.sockets = []
        self.ctx.term()


class PlanReceiver:
    """A worker's end: the next plan, ``None`` on quit; :meth:`recv` returns ``False`` after a quiet poll."""

    def __init__(self, group: TPGroup) -> None:
        address = group.store.get(_key(group.rank)).decode()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.connect(address)
        self.decoder = msgspec.msgpack.Decoder(SchedulerOutput)

    def recv(self, timeout_ms: int = POLL_MS) -> SchedulerOutput | bool | None:
        """A plan, ``None`` when rank 0 said quit, or ``False`` when nothing came within ``timeout_ms``."""
        if not self.sock.poll(timeout_ms):
            return False
        kind, payload = self.sock.recv_multipart(copy=False)
        if kind.bytes == QUIT:
            return None
        return self.decoder.decode(payload.buffer)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
