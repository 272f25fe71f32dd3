"""Block pool: null block, reference counts, lazy eviction, reset."""

import pytest

from paged_core.errors import ConfigError, PagedError
from paged_core.memory.block_pool import BlockPool


def test_null_block_is_never_handed_out() -> None:
    pool = BlockPool(4)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [1, 2, 3]
    with pytest.raises(PagedError):
        pool.get_new_blocks(1)


def test_freed_block_keeps_hash_until_handed_out_again() -> None:
    pool = BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, b"h-a")
    pool.free_blocks([a, b])
    assert pool.get_cached_block(b"h-a") is a and a.block_hash == b"h-a"
    # a is at the head of the free queue: the next allocation evicts it.
    (again,) = pool.get_new_blocks(1)
    assert again is a
    assert a.block_hash is None and pool.get_cached_block(b"h-a") is None


def test_touch_pulls_a_free_cached_block_out_of_the_queue() -> None:
    pool = BlockPool(3)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, b"x")
    pool.free_blocks([a])
    assert pool.num_free_blocks == 2
    pool.touch([a])
    assert a.ref_cnt == 1 and pool.num_free_blocks == 1 and a not in pool.free_queue


def test_double_free_raises() -> None:
    pool = BlockPool(2)
    (a,) = pool.get_new_blocks(1)
    pool.free_blocks([a])
    with pytest.raises(PagedError, match="double free"):
        pool.free_blocks([a])


def test_duplicate_hash_keeps_first_block() -> None:
    pool = BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, b"same")
    pool.cache_block(b, b"same")
    assert pool.get_cached_block(b"same") is a and b.block_hash is None


def test_reset_prefix_cache_refuses_while_blocks_are_in_use() -> None:
    pool = BlockPool(3)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, b"k")
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(b"k") is a
    pool.free_blocks([a])
    assert pool.reset_prefix_cache() is True
    assert pool.cached == {} and a.block_hash is None


def test_caching_disabled_never_indexes() -> None:
    pool = BlockPool(3, enable_caching=False)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, b"k")
    assert pool.cached == {} and a.block_hash is None


@pytest.mark.parametrize("bad", [0, 1, -3, 2.5, "8"])
def test_bad_num_blocks(bad: object) -> None:
    with pytest.raises(ConfigError, match="num_blocks"):
        BlockPool(bad)  # type: ignore[arg-type]


def test_usage_fraction() -> None:
    pool = BlockPool(5)
    assert pool.usage == 0.0
    pool.get_new_blocks(2)
    assert pool.usage == 0.5
