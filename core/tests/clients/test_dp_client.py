"""DataParallelClient over two in-process fake cores: routing, aborts, per-core reports and one core's death."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from paged_core import SamplingParams
from paged_core.clients.dp_client import DataParallelClient
from paged_core.clients.factory import thread_client
from paged_core.engine_core.messages import CoreOutputs
from paged_core.errors import EngineDeadError
from paged_core.serve import AsyncEngine, ServeConfig, build_app

from ..serve.fake_engine import FakeEngine


class MortalEngine(FakeEngine):
    """A fake core whose next step raises once ``die`` is set (its thread ends, as a killed core would)."""

    die = False

    def close(self) -> None:
        """Nothing to release (its CoreThread closes the core after the loop ends)."""

    def step(self) -> CoreOutputs:
        if self.die:
            raise RuntimeError("simulated crash")
        return super().step()


def make() -> tuple[list[MortalEngine], DataParallelClient]:
    engines = [MortalEngine(), MortalEngine()]
    return engines, DataParallelClient([thread_client(e) for e in engines])


async def drain(stream: object) -> list[object]:
    return [out async for out in stream]  # type: ignore[attr-defined]


def test_facts_sum_capacities_and_requests_spread_over_both_cores() -> None:
    async def scenario() -> None:
        engines, client = make()
        assert client.facts.max_num_seqs == 2 * 256 and client.facts.num_usable_blocks == 20
        ae = AsyncEngine(client, engines[0].tokenizer)
        ae.start()
        try:
            streams = [ae.add(f"r{i}", [65 + i], SamplingParams(max_tokens=20)) for i in range(4)]
            placed = [client.router.core_of(f"r{i}") for i in range(4)]  # placed as they are sent: nothing waits
            assert sorted(placed.count(core) for core in (0, 1)) == [2, 2]
            outs = await asyncio.gather(*(drain(s) for s in streams))
            assert all(o[-1].finished and o[-1].outputs[0].text == "a" * 20 for o in outs)  # type: ignore[attr-defined]
            assert client.router.num_placed == 0  # every finished request was forgotten
            assert [s.routed["balance"] for s in client.per_core] == [2, 2]
            assert await ae.reset_prefix_cache() is True
        finally:
            ae.stop()

    asyncio.run(scenario())


def test_aborts_reach_the_core_running_the_request() -> None:
    async def scenario() -> None:
        engines, client = make()
        ae = AsyncEngine(client, engines[0].tokenizer)
        ae.start()
        try:
            ae.add("x", [65], SamplingParams(max_tokens=10_000))
            ae.add("y", [66], SamplingParams(max_tokens=10_000, n=2))
            core_y = client.router.core_of("y")
            assert core_y is not None and core_y != client.router.core_of("x")
            assert ae.abort("y")
            for _ in range(200):
                if "y" in engines[core_y].aborted:
                    break
                await asyncio.sleep(0.01)
            assert engines[core_y].aborted == ["y"] and engines[1 - core_y].aborted == []
        finally:
            ae.stop()

    asyncio.run(scenario())


def test_one_dead_core_fails_only_its_streams_and_the_other_serves_on() -> None:
    async def scenario() -> None:
        engines, client = make()
        died: list[str] = []
        ae = AsyncEngine(client, engines[0].tokenizer, on_dead=died.append)
        ae.start()
        try:
            long = [ae.add(f"r{i}", [65 + i], SamplingParams(max_tokens=10_000)) for i in range(2)]
            for stream in long:  # each has a token: its core answered for it, so it cannot move any more
                await asyncio.wait_for(anext(aiter(stream)), 10)
            victim = client.router.core_of("r1")
            assert victim is not None
            engines[victim].die = True
            with pytest.raises(EngineDeadError, match=f"engine core {victim} died: engine thread died"):
                await asyncio.wait_for(drain(long[1]), 10)
            assert ae.healthy and not died
            report = ae.core_health()
            assert report is not None and report[victim]["status"] == "dead"
            assert "simulated crash" in report[victim]["reason"] and report[1 - victim]["status"] == "ok"
            # New requests all land on the live core and complete.
            fresh = [ae.add(f"n{i}", [70 + i], SamplingParams(max_tokens=5)) for i in range(3)]
            assert {client.router.core_of(f"n{i}") for i in range(3)} == {1 - victim}
            for s in fresh:
                assert (await asyncio.wait_for(drain(s), 10))[-1].finished  # type: ignore[attr-defined]
            # The other core's long request was untouched; when that core dies too, the engine is dead.
            engines[1 - victim].die = True
            with pytest.raises(EngineDeadError, match=f"engine core {1 - victim} died"):
                await asyncio.wait_for(drain(long[0]), 10)
            for _ in range(200):
                if died:
                    break
                await asyncio.sleep(0.01)
            assert died and died[0].startswith("every engine core died") and not ae.healthy
        finally:
            ae.stop()

    asyncio.run(scenario())


def test_metrics_and_health_report_each_core() -> None:
    engines = [MortalEngine(), MortalEngine()]
    client = DataParallelClient([thread_client(e) for e in engines])
    ae = AsyncEngine(client, engines[0].tokenizer)
    with TestClient(build_app(ae, ServeConfig())) as http:
        r = http.post("/v1/completions", json={"model": "fake", "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200, r.text
        health = http.get("/health").json()
        assert health == {
            "status": "ok",
            "engines": [{"engine": 0, "pid": None, "status": "ok"}, {"engine": 1, "pid": None, "status": "ok"}],
        }
        text = http.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    for engine in ("0", "1"):
        assert samples[("paged_engine_up", (("engine", engine),))] == 1
        assert ("paged_kv_cache_blocks", (("engine", engine),)) in samples
        assert ("paged_prefix_cache_hit_ratio", (("engine", engine),)) in samples
    assert ("paged_kv_cache_blocks", ()) not in samples  # per-core series replace the unlabelled ones
    routed = sum(v for (name, _), v in samples.items() if name == "paged_dp_routed_requests_total")
    assert routed == 1


def test_data_parallel_is_refused_in_process_and_offline() -> None:
    from paged_core.data_parallel import require_one_engine_core
    from paged_core.engine_config import EngineConfig
    from paged_core.errors import ConfigError
    from paged_core.serve.server import start_engine

    config = EngineConfig.of(model="/nonexistent/model", data_parallel_size=2)
    with pytest.raises(ConfigError, match=r"--data-parallel-size 2 .* --engine-in-process"):
        start_engine(config, in_process=True)  # refused before anything loads
    with pytest.raises(ConfigError, match="data_parallel_size=2 runs in `paged serve`; LLM runs one engine core"):
        require_one_engine_core(config)
    require_one_engine_core(config.replace(data_parallel_size=1))


def test_a_request_its_dead_core_never_answered_for_runs_on_another_core() -> None:
    async def scenario() -> None:
        engines, client = make()
        ae = AsyncEngine(client, engines[0].tokenizer)
        ae.start()
        try:
            first = ae.add("a", [65], SamplingParams(max_tokens=10_000))
            await asyncio.wait_for(anext(aiter(first)), 10)
            home = client.router.core_of("a")
            assert home is not None
            engines[1 - home].die = True  # the other core dies at its next step, before answering for "b"
            moved = ae.add("b", [66], SamplingParams(max_tokens=3))
            assert client.router.core_of("b") == 1 - home
            outs = await asyncio.wait_for(drain(moved), 10)
            assert outs[-1].finished and outs[-1].outputs[0].text == "aaa"  # type: ignore[attr-defined]
            assert client.router.cores[1 - home].alive is False and ae.healthy
        finally:
            ae.stop()

    asyncio.run(scenario())
