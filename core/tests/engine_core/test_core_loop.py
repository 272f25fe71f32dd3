"""CoreLoop: the engine-core process's message loop, driven over real zmq sockets with a fake core."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from paged_core.engine_core.loop import MAX_MESSAGE_BYTES, CoreLoop
from paged_core.engine_core.messages import (
    CoreAbort,
    CoreAdmission,
    CoreOutputs,
    CoreRequest,
    CoreRequests,
    CoreShutdown,
    CoreUtility,
    CoreUtilityResult,
    FromCore,
    SchedulerStats,
    SeqDelta,
)
from paged_core.errors import RequestRejectedError
from paged_core.sampling.params import SamplingParams


class StepCore:
    """Each request emits one token per step until it has ``max_tokens``; prompt [0] is refused."""

    def __init__(self) -> None:
        self.left: dict[str, int] = {}
        self.steps = 0

    def add_request(self, request: CoreRequest) -> None:
        if request.prompt_token_ids == [0]:
            raise RequestRejectedError("prompt [0] is refused")
        self.left[request.request_id] = request.params.max_tokens

    def abort(self, abort: CoreAbort) -> None:
        for rid in abort.request_ids:
            self.left.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.left)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=len(self.left), steps=self.steps)

    def call(self, method: str) -> Any:
        if method != "stats":
            raise ValueError(f"unknown utility call {method!r}")
        return self.stats()

    def step(self) -> CoreOutputs:
        self.steps += 1
        deltas = []
        for rid in list(self.left):
            self.left[rid] -= 1
            done = self.left[rid] == 0
            deltas.append(SeqDelta(rid, 0, [7], finish_reason="length" if done else None))
            if done:
                del self.left[rid]
        return CoreOutputs(deltas, self.stats())


@pytest.fixture
def loop() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any], threading.Thread]]:
    ctx = zmq.Context()
    to_core, from_core = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    to_core.bind("inproc://in")
    from_core.bind("inproc://out")
    inbox.connect("inproc://in")
    outbox.connect("inproc://out")
    core_loop = CoreLoop(StepCore(), inbox, outbox, parent_pid=None)
    thread = threading.Thread(target=core_loop.run, daemon=True)
    thread.start()
    yield to_core, from_core, thread
    to_core.send(msgspec.msgpack.encode(CoreShutdown()))
    thread.join(5)
    for s in (to_core, from_core, inbox, outbox):
        s.close(linger=0)
    ctx.term()


def _recv(sock: zmq.Socket[Any]) -> FromCore:
    assert sock.poll(5000), "no message from the core loop within 5 s"
    msg: FromCore = msgspec.msgpack.decode(sock.recv(), type=FromCore)
    return msg


def _until_finished(sock: zmq.Socket[Any], rid: str) -> list[FromCore]:
    seen = []
    while True:
        msg = _recv(sock)
        seen.append(msg)
        if isinstance(msg, CoreOutputs) and any(d.request_id == rid and d.finish_reason for d in msg.deltas):
            return seen


def test_adds_are_admitted_or_refused_then_stepped_to_the_end(loop: Any) -> None:
    to_core, from_core, _ = loop
    batch = CoreRequests([CoreRequest("a", [1, 2], SamplingParams(max_tokens=3)),
                          CoreRequest("bad", [0], SamplingParams())])  # fmt: skip
    to_core.send(msgspec.msgpack.encode(batch))
    admission = _recv(from_core)
    assert admission == CoreAdmission(["a"], {"bad": "prompt [0] is refused"})
    steps = [m for m in _until_finished(from_core, "a") if isinstance(m, CoreOutputs)]
    assert [d.new_token_ids for m in steps for d in m.deltas] == [[7], [7], [7]]


def test_junk_and_oversized_messages_are_dropped_and_the_loop_serves_on(
    loop: Any, caplog: pytest.LogCaptureFixture
) -> None:
    to_core, from_core, thread = loop
    to_core.send(b"\xc1")  # not msgpack
    to_core.send(msgspec.msgpack.encode({"type": "add", "request_id": 5}))  # a tagged message with wrong fields
    to_core.send(msgspec.msgpack.encode({"type": "no-such-message"}))
    to_core.send(b"\0" * (MAX_MESSAGE_BYTES + 1))
    to_core.send(msgspec.msgpack.encode(CoreRequest("ok", [3], SamplingParams(max_tokens=1))))
    assert _recv(from_core) == CoreAdmission(["ok"], {})
    _until_finished(from_core, "ok")
    assert thread.is_alive()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("dropped a malformed" in m for m in messages) == 3
    assert any(f"dropped a {MAX_MESSAGE_BYTES + 1}-byte message" in m for m in messages)
    to_core.send(msgspec.msgpack.encode(CoreUtility(1, "dropped_messages")))
    answer = _recv(from_core)
    assert isinstance(answer, CoreUtilityResult) and answer.result == 4


def test_utility_calls_answer_by_id_even_when_they_fail(loop: Any) -> None:
    to_core, from_core, _ = loop
    to_core.send(msgspec.msgpack.encode(CoreUtility(4, "stats")))
    answer = _recv(from_core)
    assert isinstance(answer, CoreUtilityResult) and answer.call_id == 4 and answer.error is None
    to_core.send(msgspec.msgpack.encode(CoreUtility(5, "reboot")))
    answer = _recv(from_core)
    assert isinstance(answer, CoreUtilityResult) and answer.call_id == 5
    assert "unknown utility call" in (answer.error or "")


def test_an_abort_on_an_idle_core_reports_fresh_stats(loop: Any) -> None:
    to_core, from_core, _ = loop
    to_core.send(msgspec.msgpack.encode(CoreRequest("long", [3], SamplingParams(max_tokens=10**6))))
    assert _recv(from_core) == CoreAdmission(["long"], {})
    to_core.send(msgspec.msgpack.encode(CoreAbort(request_ids=["long"])))
    while True:
        msg = _recv(from_core)
        if isinstance(msg, CoreOutputs) and msg.stats.num_running == 0:
            break
