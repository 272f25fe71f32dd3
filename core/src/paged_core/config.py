"""Engine-independent configuration of the KV cache and the scheduler."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from paged_core.errors import ConfigError

POLICIES = ("fcfs", "priority")
MAX_BLOCK_SIZE = 4096
# Block ids travel as int32 in the block table; slots as int64.
MAX_NUM_BLOCKS = 2**31 - 1


def _require_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be an int {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV-cache geometry and prefix caching.

    ``num_blocks`` includes the null block (id 0), so ``num_blocks - 1`` blocks
    hold KV.
    """

    num_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    hash_algorithm: str = "sha256"

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        _require_int("num_blocks", self.num_blocks, 2, MAX_NUM_BLOCKS)
        allowed = sorted(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake"))
        if self.hash_algorithm not in allowed:
            raise ConfigError(f"hash_algorithm must be one of {', '.join(allowed)}; got {self.hash_algorithm!r}")

    @classmethod
    def from_memory(cls, budget_bytes: int, bytes_per_block: int, **kwargs: object) -> CacheConfig:
        """Size the cache from a byte budget (all layers' K and V for one block = ``bytes_per_block``)."""
        _require_int("bytes_per_block", bytes_per_block, 1)
        if budget_bytes < 2 * bytes_per_block:
            raise ConfigError(
                f"kv_cache_memory of {budget_bytes} bytes is smaller than two blocks "
                f"({2 * bytes_per_block} bytes: one usable block plus the null block)"
            )
        return cls(num_blocks=min(budget_bytes // bytes_per_block, MAX_NUM_BLOCKS), **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Per-step budgets and policies.

    ``max_num_batched_tokens`` caps tokens per step across requests;
    ``max_num_seqs`` caps running requests. With chunked prefill off, a prompt
    must fit in one step's token budget.
    """

    max_model_len: int = 2048
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    num_lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        _require_int("max_model_len", self.max_model_len, 1)
        _require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _require_int("max_num_seqs", self.max_num_seqs, 1)
        _require_int("num_lookahead_tokens", self.num_lookahead_tokens, 0)
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}; got {self.policy!r}")
