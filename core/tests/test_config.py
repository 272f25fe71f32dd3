"""Configuration validation names the field and the allowed values."""

import pytest

from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.errors import ConfigError


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
