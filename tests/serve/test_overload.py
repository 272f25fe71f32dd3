"""Overload is signalled (reproduction 8): a bounded in-flight queue answers 429 past its bound while ``/health``
stays fast, and connections that idle or never finish their request are closed after their timeouts.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from paged_core.errors import ConfigError
from paged_core.serve import ServeConfig, build_app
from paged_core.serve.admission import Admission, QueueFull
from paged_core.serve.timeouts import uvicorn_options

from .serve_helpers import MODEL_NAME, ServerThread, make_engine, metric_values

MAX_NUM_SEQS = 2
MAX_QUEUED = 8
FLOOD = 40  # well past the bound of MAX_NUM_SEQS + MAX_QUEUED = 10 sequences
TOKENS = 48  # each admitted request takes this many steps, so the bound is still full when the last ones arrive
IDLE, HEADERS, BODY = 0.5, 1.0, 1.0
MARGIN = 2.0  # the machine is shared: allow for scheduling delay on top of each timeout


def _server(loaded: Any, config: ServeConfig, **engine: Any) -> ServerThread:
    app = build_app(make_engine(loaded, **engine), config)
    return ServerThread(app, **uvicorn_options(config.idle_timeout, config.header_timeout, config.body_timeout))


@pytest.fixture(scope="module")
def flood_server(loaded: Any) -> Iterator[ServerThread]:
    # Generous connection timeouts here: the flood must be refused by the queue bound, not by a timeout.
    config = ServeConfig(served_model_name=MODEL_NAME, max_queued_requests=MAX_QUEUED, idle_timeout=60)
    with _server(loaded, config, max_num_seqs=MAX_NUM_SEQS) as s:
        yield s


@pytest.fixture(scope="module")
def timeout_server(loaded: Any) -> Iterator[ServerThread]:
    config = ServeConfig(served_model_name=MODEL_NAME, idle_timeout=IDLE, header_timeout=HEADERS, body_timeout=BODY)
    with _server(loaded, config) as s:
        yield s


# ---- the admission bound itself ---------------------------------------------


def test_admission_refuses_past_the_bound_and_gives_slots_back() -> None:
    refusals: list[str] = []
    gate = Admission(running_limit=2, queue_limit=3, on_refuse=refusals.append)
    tickets = [gate.acquire() for _ in range(5)]
    with pytest.raises(QueueFull, match=r"limit is 5 \(max_num_seqs 2 \+ max_queued_requests 3\)") as info:
        gate.acquire()
    response = info.value.response()
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    assert info.value.body()["error"]["type"] == "rate_limit_error" and refusals == ["queue_full"]
    tickets[0].release()
    tickets[0].release()  # idempotent: a second release must not free someone else's slot
    assert gate.in_flight == 4
    with pytest.raises(QueueFull):
        tickets[1].adopt(3)  # growing to 3 sequences needs 2 more slots; only 1 is free
    assert tickets[1].size == 1 and not tickets[1].adopted and gate.in_flight == 4
    tickets[1].adopt(2)
    assert gate.in_flight == 5
    for t in tickets[1:]:
        t.release()
    assert gate.in_flight == 0
    # A request bigger than the whole bound still gets in when nothing else is in flight.
    big = gate.acquire(50)
    assert big.size == 5 and gate.in_flight == 5
    big.release()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_queued_requests", -1),
        ("idle_timeout", 0),
        ("header_timeout", float("nan")),
        ("body_timeout", 1e9),
        ("drain_timeout", -1),
    ],
)
def test_overload_settings_are_validated(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        ServeConfig(**{field: value})  # type: ignore[arg-type]


def test_serve_cli_has_the_overload_options() -> None:
    from paged_core.cli.main import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for option in ("--max-queued-requests", "--idle-timeout", "--header-timeout", "--body-timeout", "--drain-timeout"):
        assert option in help_text


# ---- the flood ---------------------------------------------------------------


def _watch(server: ServerThread, stop: threading.Event, probes: list[tuple[int, float]], peaks: list[int]) -> None:
    """From its own thread: time /health, and sample the admission count, until ``stop``."""
    gate = server.server.config.app.state.paged.admission
    with httpx.Client(timeout=10) as http:
        while not stop.is_set():
            t = time.perf_counter()
            code = http.get(f"{server.url}/health").status_code
            probes.append((code, time.perf_counter() - t))
            peaks.append(gate.in_flight)
            time.sleep(0.01)


async def _flood(url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=FLOOD + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:

        async def one(i: int) -> httpx.Response:
            body = {
                "model": MODEL_NAME,
                "prompt": f"Flood request {i} wants a long answer",
                "max_tokens": TOKENS,
                "ignore_eos": True,
                "stream": i % 2 == 1,
            }
            r = await http.post(f"{url}/v1/completions", json=body)
            await r.aread()  # a stream is read to its end
            return r

        return await asyncio.gather(*(one(i) for i in range(FLOOD)))


def _settled(url: str, timeout: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metric_values(httpx.get(f"{url}/metrics").text)
        idle = m["paged_requests_running"] == m["paged_requests_waiting"] == m["paged_requests_in_flight"] == 0
        if (idle and m["paged_kv_cache_free_blocks"] == m["paged_kv_cache_blocks"]) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_flood_past_the_queue_bound_gets_429_while_health_stays_fast(flood_server: ServerThread) -> None:
    url = flood_server.url
    before = metric_values(httpx.get(f"{url}/metrics").text)
    assert before["paged_requests_in_flight_limit"] == MAX_NUM_SEQS + MAX_QUEUED
    stop = threading.Event()
    probes: list[tuple[int, float]] = []
    peaks: list[int] = []
    watcher = threading.Thread(target=_watch, args=(flood_server, stop, probes, peaks))
    watcher.start()
    try:
        time.sleep(0.05)
        responses = asyncio.run(_flood(url))
    finally:
        stop.set()
        watcher.join(30)
    codes = [r.status_code for r in responses]
    ok, refused = codes.count(200), [r for r in responses if r.status_code == 429]
    assert ok + len(refused) == FLOOD, codes
    # Every request arrives at once and the admitted ones take many steps, so the bound fills and holds.
    assert ok >= MAX_NUM_SEQS + MAX_QUEUED and len(refused) >= FLOOD // 2, codes
    for r in refused:
        assert int(r.headers["Retry-After"]) >= 1
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "queue_full", error
        assert "max_queued_requests 8" in error["message"]
    for r in responses:
        if r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.rstrip().endswith("data: [DONE]")
        elif r.status_code == 200:
            assert r.json()["usage"]["completion_tokens"] == TOKENS
    assert max(peaks) <= MAX_NUM_SEQS + MAX_QUEUED
    assert probes and all(code == 200 for code, _ in probes)
    latencies = sorted(dt for _, dt in probes)
    p50, p99 = (latencies[min(len(latencies) - 1, int(len(latencies) * q))] for q in (0.5, 0.99))
    print(
        f"flood: {ok} served, {len(refused)} refused; /health p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms "
        f"over {len(latencies)} probes"
    )
    assert len(latencies) >= 10
    # A /health that waited for the engine would wait for whole steps during the flood (seconds here), at the
    # median too. The tail is looser: the prober, the 40 clients and the server share this process's GIL on
    # a shared 2-core machine, where one stall of 0.8 s was seen in a full run (p99 under 0.1 s in most).
    assert p50 < 0.1, f"/health p50 {p50 * 1000:.1f} ms during the flood"
    assert p99 < 2.0, f"/health p99 {p99 * 1000:.1f} ms during the flood"
    after = _settled(url)
    assert after["paged_requests_in_flight"] == 0
    assert after["paged_requests_running"] == 0 and after["paged_requests_waiting"] == 0
    assert after["paged_kv_cache_free_blocks"] == after["paged_kv_cache_blocks"]
    refusals = (
        after["paged_requests_refused_total{reason=queue_full}"]
        - before["paged_requests_refused_total{reason=queue_full}"]
    )
    assert refusals == len(refused)
    # And the server serves again at once.
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text


def test_requests_refused_before_the_engine_give_their_slot_back(flood_server: ServerThread) -> None:
    gate = flood_server.server.config.app.state.paged.admission
    with httpx.Client(timeout=30) as http:
        for body in ({"model": MODEL_NAME, "prompt": "x", "temperature": -1}, {"model": "nope", "prompt": "x"}, {}):
            assert http.post(f"{flood_server.url}/v1/completions", json=body).status_code in (400, 404)
            assert http.post(f"{flood_server.url}/v1/chat/completions", json=body).status_code in (400, 404)
    assert gate.in_flight == 0


# ---- connection timeouts -----------------------------------------------------


def _connect(server: ServerThread) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(HEADERS + BODY + IDLE + 2 * MARGIN)
    return sock


def _until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    t = time.monotonic()
    data = b""
    with sock:
        while chunk := sock.recv(4096):
            data += chunk
    return data, time.monotonic() - t


def test_idle_connection_is_closed(timeout_server: ServerThread) -> None:
    data, waited = _until_closed(_connect(timeout_server))
    assert data == b"" and waited < IDLE + MARGIN


def test_half_sent_headers_are_closed_with_408(timeout_server: ServerThread) -> None:
    sock = _connect(timeout_server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: applic")
    data, waited = _until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ") and b"request headers not received within 1 s" in data
    assert HEADERS * 0.9 < waited < HEADERS + MARGIN


def test_trickled_body_is_closed_and_frees_its_slot(timeout_server: ServerThread) -> None:
    gate = timeout_server.server.config.app.state.paged.admission
    sock = _connect(timeout_server)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    data, waited = _until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ") and b"request body not received within 1 s" in data
    assert BODY * 0.9 < waited < BODY + MARGIN
    deadline = time.monotonic() + 5
    while gate.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gate.in_flight == 0


def test_keep_alive_connection_is_closed_after_idling(timeout_server: ServerThread) -> None:
    sock = _connect(timeout_server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
    data, waited = _until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 ") and waited < IDLE + MARGIN


def test_slow_but_steady_client_within_the_timeouts_is_served(timeout_server: ServerThread) -> None:
    sock = _connect(timeout_server)
    body = b'{"model": "%s", "prompt": "Hi", "max_tokens": 2}' % MODEL_NAME.encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nConnection: close\r\n"
    sock.sendall(head[:20])
    time.sleep(HEADERS / 3)
    sock.sendall(head[20:] + b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
    time.sleep(BODY / 3)
    sock.sendall(body[10:])
    data, _ = _until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 "), data[:200]
