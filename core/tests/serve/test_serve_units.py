"""Small pieces of the server: config validation, limits, error text, byte tables, auth, metrics, AsyncEngine."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from paged_core import RequestMetrics, RequestOutput, SamplingParams
from paged_core.clients.dp_client import sum_stats
from paged_core.clients.factory import thread_client
from paged_core.engine_core.messages import SchedulerStats as EngineStats
from paged_core.errors import ConfigError, RequestRejectedError
from paged_core.serve import AsyncEngine, EngineDeadError, ServeConfig, build_app
from paged_core.serve.body import decode_json
from paged_core.serve.errors import APIError
from paged_core.serve.metrics import ServerMetrics
from paged_core.serve.params import check_context
from paged_core.serve.tokens import _BYTES

from .fake_engine import REFUSED_TOKEN, FakeEngine


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("port", 70000, "port must be"),
        ("api_key", "", "api_key must be"),
        ("max_n", 0, "max_n must be"),
        ("max_body_bytes", True, "max_body_bytes must be"),
        ("max_tokens_limit", 0, "max_tokens_limit must be"),
    ],
)
def test_serve_config_names_the_bad_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServeConfig(**{field: value})  # type: ignore[arg-type]


def test_check_context_fills_or_refuses() -> None:
    assert check_context(10, None, 100, "prompt") == 90
    assert check_context(10, 90, 100, "prompt") == 90
    with pytest.raises(APIError, match="101 were requested") as info:
        check_context(10, 91, 100, "prompt")
    assert info.value.code == "context_length_exceeded" and info.value.status == 400
    with pytest.raises(APIError, match="100 tokens in the prompt leave no room"):
        check_context(100, None, 100, "prompt")


def test_decode_json_says_where_it_broke() -> None:
    assert decode_json(b'{"a": 1}') == {"a": 1}
    with pytest.raises(APIError, match=r"line 2, column 1"):
        decode_json(b'{"a": 1,\n}')
    with pytest.raises(APIError, match="byte 0xc3 at offset 1"):
        decode_json(b'"\xc3(')


def test_byte_level_table_inverts_gpt2_printables() -> None:
    assert len(_BYTES) == 256 and sorted(_BYTES.values()) == list(range(256))
    assert _BYTES["\u0120"] == 0x20 and _BYTES["\u010a"] == 0x0A and _BYTES["a"] == 0x61


def test_auth_compares_the_whole_bearer_header(engine: FakeEngine) -> None:
    with TestClient(build_app(engine, ServeConfig(api_key="sekret"))) as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekre"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekret!"}).status_code == 401
        r = c.get("/v1/models", headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200
        denied = c.post("/tokenize", json={"prompt": "x"})
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200


def _output(rid: str, new: int, finished: bool, arrival: float) -> RequestOutput:
    from paged_core import CompletionOutput

    c = CompletionOutput(
        index=0, token_ids=[1] * new, new_token_ids=[1] * new, finish_reason="stop" if finished else None
    )
    m = RequestMetrics(
        arrival_time=arrival, first_token_time=arrival + 0.1, finished_time=arrival + 1.0 if finished else None
    )
    return RequestOutput(rid, None, [1, 2, 3], [c], finished, m)


def test_metrics_count_tokens_latencies_and_aborts() -> None:
    m = ServerMetrics(lambda: EngineStats(kv_usage=0.25, num_running=2, num_preemptions=3, prefix_hits=7))
    t0 = time.monotonic()
    m.observe([_output("a", 1, False, t0), _output("b", 1, False, t0)], t0 + 0.1)
    m.observe([_output("a", 2, True, t0)], t0 + 0.3)
    m.on_abort("b")
    samples = {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    assert samples["paged_generation_tokens_total[]"] == 4
    assert samples["paged_prompt_tokens_total[]"] == 6
    assert samples["paged_time_to_first_token_seconds_count[]"] == 2
    assert samples["paged_inter_token_latency_seconds_count[]"] == 1
    assert samples["paged_inter_token_latency_seconds_sum[]"] == pytest.approx(0.2)
    assert samples["paged_e2e_request_latency_seconds_sum[]"] == pytest.approx(1.0)
    assert samples["paged_requests_finished_total[('finish_reason', 'stop')]"] == 1
    assert samples["paged_requests_aborted_total[]"] == 1
    assert samples["paged_kv_cache_usage_ratio[]"] == 0.25 and samples["paged_preemptions_total[]"] == 3
    assert samples["paged_prefix_cache_hits_tokens_total[]"] == 7 and samples["paged_requests_running[]"] == 2
    assert samples["paged_batch_invariant[]"] == 0  # not reported invariant: 0


def test_the_batch_invariant_gauge_reads_the_running_configuration() -> None:
    def gauge(*stats: EngineStats, cores: bool = False) -> dict[str, float]:
        read_cores = (
            (lambda: [SimpleNamespace(index=i, stats=s, alive=True, routed={}) for i, s in enumerate(stats)])
            if cores
            else None
        )
        m = ServerMetrics(lambda: stats[0], read_cores)
        return {
            str(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(m.render().decode())
            for s in f.samples
            if s.name == "paged_batch_invariant"
        }

    assert gauge(EngineStats(batch_invariant=True)) == {"[]": 1.0}
    per_core = gauge(EngineStats(batch_invariant=True), EngineStats(), cores=True)
    assert per_core == {"[('engine', '0')]": 1.0, "[('engine', '1')]": 0.0}
    assert sum_stats([], [EngineStats(batch_invariant=True)] * 2).batch_invariant
    assert not sum_stats([], [EngineStats(batch_invariant=True), EngineStats()]).batch_invariant
    assert not sum_stats([], []).batch_invariant


def test_async_engine_serves_refuses_aborts_and_stops() -> None:
    engine = FakeEngine()

    async def scenario() -> None:
        ae = AsyncEngine(thread_client(engine), engine.tokenizer)
        ae.start()
        try:
            stream = ae.add("r1", [5, 6], SamplingParams(max_tokens=3))
            outs = [o async for o in stream]
            assert [o.outputs[0].text for o in outs] == ["a", "aa", "aaa"] and outs[-1].finished
            refused = ae.add("r2", [REFUSED_TOKEN], SamplingParams())  # no round trip: the stream carries the refusal
            with pytest.raises(RequestRejectedError, match="max_tokens must be refused"):
                async for _ in refused:
                    pass
            assert ae.num_streams == 0
            long = ae.add("r3", [5], SamplingParams(max_tokens=10_000))
            assert ae.abort("r3") and not ae.abort("r3")
            for _ in range(200):
                if "r3" in engine.aborted:
                    break
                await asyncio.sleep(0.01)
            assert "r3" in engine.aborted and not engine.groups
            assert ae.stats.num_running == 0
            pending = ae.add("r4", [5], SamplingParams(max_tokens=10_000))
        finally:
            ae.stop()
        with pytest.raises(EngineDeadError, match="shutting down"):
            async for _ in pending:
                pass
        assert not ae.healthy
        del long

    asyncio.run(scenario())


def test_adds_after_a_stop_are_refused_not_left_hanging() -> None:
    async def scenario() -> None:
        fake = FakeEngine()
        ae = AsyncEngine(thread_client(fake), fake.tokenizer)
        ae.start()
        sent = ae.add("sent", [5], SamplingParams(max_tokens=10_000))
        ae.stop()
        with pytest.raises(EngineDeadError):  # after stop, add refuses up front
            ae.add("late", [5], SamplingParams())
        with pytest.raises(EngineDeadError):  # the client refuses too, whoever calls it
            ae.client.add([])
        with pytest.raises(EngineDeadError, match="shutting down"):  # a stream open at the stop is ended
            await asyncio.wait_for(anext(aiter(sent)), 5)

    asyncio.run(scenario())
