"""CoreLoop: the engine core's message loop, driven over real zmq sockets (and over queues) with a fake core."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from paged_core.engine_core.beam_params import BeamParams
from paged_core.engine_core.channels import MAX_MESSAGE_BYTES, QueueChannel, SocketChannel
from paged_core.engine_core.loop import CoreLoop
from paged_core.engine_core.messages import (
    CoreAbort,
    CoreFacts,
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

VOCAB = 100


class StepCore:
    """Each request emits one token per step until it has ``max_tokens``; prompt [0] is refused."""

    def __init__(self) -> None:
        self.left: dict[str, int] = {}
        self.steps = 0
        self.added: list[CoreRequest] = []

    def facts(self) -> CoreFacts:
        return CoreFacts(
            model_name="step",
            model_source="step",
            vocab_size=VOCAB,
            eos_token_ids=[],
            max_model_len=64,
            block_size=16,
            num_usable_blocks=8,
            max_num_seqs=4,
            backend="fake",
            dtype="float32",
            graph_mode="eager",
            model_path="step",
        )

    def add_request(self, request: CoreRequest) -> None:
        self.added.append(request)
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
    core_loop = CoreLoop(StepCore(), SocketChannel(inbox, outbox), parent_pid=None)
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


def test_adds_are_not_answered_and_refusals_come_with_the_next_outputs(loop: Any) -> None:
    to_core, from_core, _ = loop
    batch = CoreRequests(
        [CoreRequest("a", [1, 2], SamplingParams(max_tokens=3)), CoreRequest("bad", [0], SamplingParams())]
    )
    to_core.send(msgspec.msgpack.encode(batch))
    steps = [m for m in _until_finished(from_core, "a") if isinstance(m, CoreOutputs)]
    assert steps[0].refused == {"bad": "prompt [0] is refused"} and all(not m.refused for m in steps[1:])
    assert [d.new_token_ids for m in steps for d in m.deltas] == [[7], [7], [7]]


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (CoreRequest("ids", [1, VOCAB], SamplingParams()), f"token ids must be ints in [0, {VOCAB})"),
        (CoreRequest("empty", [], SamplingParams()), "prompt is empty"),
        (CoreRequest("stop", [1], SamplingParams(stop_token_ids=[VOCAB])), "stop_token_ids"),
        (CoreRequest("beam", [1], SamplingParams(temperature=1.0), beam=BeamParams(2)), "temperature"),
        (CoreRequest("wide", [1], SamplingParams(temperature=0.0), beam=BeamParams(5)), "beam_width"),
    ],
)
def test_requests_off_the_socket_are_checked_before_the_core_sees_them(
    loop: Any, request_: CoreRequest, why: str
) -> None:
    to_core, from_core, _ = loop
    to_core.send(msgspec.msgpack.encode(request_))
    refused = _recv(from_core)
    assert isinstance(refused, CoreOutputs) and why in refused.refused[request_.request_id], refused


def test_requests_off_the_socket_are_bounded_by_the_vocabulary() -> None:
    ctx = zmq.Context()
    sockets = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    core = StepCore()
    core_loop = CoreLoop(core, SocketChannel(*sockets))
    assert core_loop.add(CoreRequest("k", [1], SamplingParams(top_k=10**6)), refused := {}) and not refused
    assert core.added[-1].params.top_k == VOCAB  # clamped: the same tokens, never wider than the logits
    for s in sockets:
        s.close(linger=0)
    ctx.term()


def test_an_in_process_channel_is_trusted_and_carries_the_objects_themselves() -> None:
    core = StepCore()
    channel = QueueChannel()
    thread = threading.Thread(target=CoreLoop(core, channel).run, daemon=True)
    thread.start()
    request = CoreRequest("k", [1], SamplingParams(top_k=10**6, max_tokens=1))
    channel.inbox.put(request)
    outputs = channel.outbox.get(timeout=5)
    assert isinstance(outputs, CoreOutputs) and outputs.deltas[0].finish_reason == "length"
    assert core.added == [request] and core.added[0] is request  # not re-checked, not copied
    channel.inbox.put(CoreShutdown())
    thread.join(5)
    assert not thread.is_alive()


def test_junk_and_oversized_messages_are_dropped_and_the_loop_serves_on(
    loop: Any, caplog: pytest.LogCaptureFixture
) -> None:
    to_core, from_core, thread = loop
    to_core.send(b"\xc1")  # not msgpack
    to_core.send(msgspec.msgpack.encode({"type": "add", "request_id": 5}))  # a tagged message with wrong fields
    to_core.send(msgspec.msgpack.encode({"type": "no-such-message"}))
    to_core.send(b"\0" * (MAX_MESSAGE_BYTES + 1))
    to_core.send(msgspec.msgpack.encode(CoreRequest("ok", [3], SamplingParams(max_tokens=1))))
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
    assert isinstance(_recv(from_core), CoreOutputs)
    to_core.send(msgspec.msgpack.encode(CoreAbort(request_ids=["long"])))
    while True:
        msg = _recv(from_core)
        if isinstance(msg, CoreOutputs) and msg.stats.num_running == 0:
            break
