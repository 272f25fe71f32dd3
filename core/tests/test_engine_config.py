"""EngineConfig: flat construction routed to its sections, msgspec round trips, one declaration per field."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from paged_core import engine_config
from paged_core.config import (
    CacheConfig,
    GraphConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from paged_core.engine_config import EngineConfig, flat_fields
from paged_core.errors import ConfigError

FULL = EngineConfig(
    model=ModelConfig(
        model="m.gguf",
        backend="cpu",
        dtype="bfloat16",
        device="cpu",
        trust_remote_code=True,
        model_impl="transformers",
        seed=7,
    ),
    cache=CacheConfig(
        block_size=32,
        kv_cache_memory="2GiB",
        memory_fraction=0.5,
        enable_prefix_caching=False,
        hash_algorithm="sha1",
        num_blocks=100,
    ),
    scheduler=SchedulerConfig(
        max_model_len=512,
        max_num_batched_tokens=256,
        max_num_seqs=8,
        enable_chunked_prefill=False,
        policy="priority",
        num_lookahead_tokens=2,
    ),
    graph=GraphConfig(graph_mode="compiled", capture_sizes=(1, 2, 4), compile_cache_dir="/tmp/cc"),
    parallel=ParallelConfig(),
)


def test_of_routes_flat_names_to_their_sections() -> None:
    cfg = EngineConfig.of(model="m.gguf", max_num_seqs=8, block_size=32, graph_mode="eager", seed=3)
    assert cfg.model == ModelConfig(model="m.gguf", seed=3)
    assert cfg.cache == CacheConfig(block_size=32)
    assert cfg.scheduler == SchedulerConfig(max_num_seqs=8)
    assert cfg.graph == GraphConfig(graph_mode="eager")
    assert EngineConfig.of() == EngineConfig()


def test_flat_round_trip_and_replace() -> None:
    assert EngineConfig.of(**FULL.to_flat()) == FULL
    changed = FULL.replace(block_size=64, max_num_seqs=4)
    assert (changed.cache.block_size, changed.scheduler.max_num_seqs) == (64, 4)
    assert changed.model is FULL.model and changed.graph is FULL.graph  # untouched sections are shared
    with pytest.raises(ConfigError, match="max_num_seqs must be an int >= 1"):
        FULL.replace(max_num_seqs=0)  # validated again


def test_unknown_names_are_refused_with_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown engine option\(s\) blocksize, foo; allowed: model, backend"):
        EngineConfig.of(blocksize=16, foo=1)
    with pytest.raises(ConfigError, match="unknown engine option"):
        EngineConfig().replace(cache=CacheConfig())  # section names are not flat names
    with pytest.raises(ConfigError, match="cache must be a CacheConfig"):
        EngineConfig(cache={"block_size": 16})  # type: ignore[arg-type]


def test_parallel_sizes_travel_in_the_parallel_section() -> None:
    cfg = EngineConfig.of(tensor_parallel_size=2, data_parallel_size=3, distributed_init="env", distributed_timeout=5)
    assert (cfg.parallel.tensor_parallel_size, cfg.parallel.data_parallel_size) == (2, 3)
    assert (cfg.parallel.distributed_init, cfg.parallel.distributed_timeout) == ("env", 5.0)
    with pytest.raises(ConfigError, match="distributed_init must be one of local, env"):
        EngineConfig.of(distributed_init="mpi")


@pytest.mark.parametrize("cfg", [EngineConfig(), FULL, EngineConfig.of(kv_cache_memory=4096, capture_sizes=[8])])
def test_msgspec_round_trip(cfg: EngineConfig) -> None:
    data = msgspec.json.encode(cfg)
    assert msgspec.json.decode(data, type=EngineConfig) == cfg


def test_msgspec_decode_validates() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"policy must be one of fcfs, priority.*\$\.scheduler"):
        msgspec.json.decode(b'{"scheduler": {"policy": "lifo"}}', type=EngineConfig)


def test_every_field_is_declared_once() -> None:
    sections = (ModelConfig, CacheConfig, SchedulerConfig, GraphConfig, ParallelConfig, SpeculativeConfig)
    leaves = [f.name for s in sections for f in dataclasses.fields(s)]
    assert len(leaves) == len(set(leaves)) and list(flat_fields()) == leaves
    assert [f.name for f in dataclasses.fields(EngineConfig)] == [
        "model",
        "cache",
        "scheduler",
        "graph",
        "parallel",
        "speculative",
    ]
    assert all(leaf.field.metadata.get("help") for leaf in flat_fields().values())


def test_a_name_in_two_sections_is_caught_at_import() -> None:
    @dataclasses.dataclass(frozen=True)
    class Clash:
        max_num_seqs: int = 1

    with pytest.raises(TypeError, match="'max_num_seqs' is declared in both scheduler and clash"):
        engine_config._flat_names({"scheduler": SchedulerConfig, "clash": Clash})
