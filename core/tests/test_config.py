"""Configuration validation names the field and the allowed values."""

import pytest

from paged_core.config import CacheConfig, GraphConfig, ModelConfig, ParallelConfig, SchedulerConfig
from paged_core.errors import ConfigError
from paged_core.memory.kv_cache_manager import KVCacheManager


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": 1}, "num_blocks"),
        ({"num_blocks": 2**31}, "num_blocks"),
        ({"num_blocks": 8, "block_size": 0}, "block_size"),
        ({"num_blocks": 8, "block_size": 5000}, "block_size"),
        ({"num_blocks": 8, "block_size": 16.0}, "block_size"),
        ({"num_blocks": 8, "hash_algorithm": "md4"}, "hash_algorithm"),
    ],
)
def test_bad_cache_config(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        CacheConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "lifo"}, "policy"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"num_lookahead_tokens": -2}, "num_lookahead_tokens"),
    ],
)
def test_bad_scheduler_config(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


def test_policy_error_lists_allowed_values() -> None:
    with pytest.raises(ConfigError, match="fcfs, priority"):
        SchedulerConfig(policy="random")


def test_memory_budget_smaller_than_a_block() -> None:
    with pytest.raises(ConfigError, match="smaller than two blocks"):
        CacheConfig.from_memory(1000, bytes_per_block=4096)
    assert CacheConfig.from_memory(10 * 4096 + 5, bytes_per_block=4096).num_blocks == 10


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (ModelConfig, {"dtype": "int8"}, "dtype must be one of auto, bfloat16, float16, float32"),
        (ModelConfig, {"model_impl": "vllm"}, "model_impl must be one of auto, fused, transformers"),
        (ModelConfig, {"seed": -1}, "seed must be an int in"),
        (ModelConfig, {"trust_remote_code": "yes"}, "trust_remote_code must be True or False"),
        (ModelConfig, {"model": ""}, "model must be a non-empty string"),
        (CacheConfig, {"memory_fraction": 0.0}, r"memory_fraction must be in \(0, 1\]"),
        (CacheConfig, {"memory_fraction": 1.5}, r"memory_fraction must be in \(0, 1\]"),
        (CacheConfig, {"kv_cache_memory": "4 parsecs"}, "kv_cache_memory must be a size"),
        (CacheConfig, {"block_size": None, "num_blocks": 1}, "num_blocks must be an int in"),
        (SchedulerConfig, {"enable_chunked_prefill": 1}, "enable_chunked_prefill must be True or False"),
        (GraphConfig, {"graph_mode": "fast"}, "graph_mode must be one of auto, eager, compiled, device"),
        (GraphConfig, {"capture_sizes": (0, 8)}, "capture_sizes must be a non-empty list of ints >= 1"),
        (GraphConfig, {"capture_sizes": ()}, "capture_sizes must be a non-empty list"),
        (ParallelConfig, {"tensor_parallel_size": 0}, "tensor_parallel_size must be an int in \\[1, 1024\\]"),
        (ParallelConfig, {"distributed_init": "slurm"}, "distributed_init must be one of local, env; got 'slurm'"),
        (ParallelConfig, {"distributed_timeout": 0}, "distributed_timeout must be seconds in \\(0, 86400\\]"),
        (ParallelConfig, {"data_parallel_size": 0}, "data_parallel_size must be an int in \\[1, 1024\\]"),
    ],
)
def test_every_section_names_the_field_and_what_is_allowed(cls: type, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


def test_none_means_derived_and_consumers_refuse_it() -> None:
    unresolved = CacheConfig()
    assert (unresolved.block_size, unresolved.num_blocks) == (None, None)
    with pytest.raises(ConfigError, match="KVCacheManager needs a resolved CacheConfig: block_size and num_blocks"):
        KVCacheManager(unresolved)
    with pytest.raises(ConfigError, match="num_blocks left None"):
        KVCacheManager(CacheConfig(block_size=16))
    with pytest.raises(ConfigError, match="Scheduler needs a resolved SchedulerConfig: max_model_len"):
        SchedulerConfig().require_resolved("Scheduler")
    assert CacheConfig(num_blocks=8, block_size=4).require_resolved("x") == (4, 8)
    assert SchedulerConfig(max_model_len=64).require_resolved("x") == 64


def test_sections_are_keyword_only_and_normalised() -> None:
    with pytest.raises(TypeError):
        CacheConfig(64)  # type: ignore[misc]  # once num_blocks came first: no silent reinterpretation
    assert CacheConfig(memory_fraction=1).memory_fraction == 1.0
    assert GraphConfig(capture_sizes=[1, 2]).capture_sizes == (1, 2)  # type: ignore[arg-type]
    assert CacheConfig(kv_cache_memory="1KiB").kv_cache_bytes == 1024
    assert CacheConfig().kv_cache_bytes is None
