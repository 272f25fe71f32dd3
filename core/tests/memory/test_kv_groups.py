"""KV-cache groups: layers grouped by window, and the manager's sliding release and windowed prefix hits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_core.config import CacheConfig
from paged_core.contract.capabilities import AttentionSpec
from paged_core.errors import UnsupportedConfigError
from paged_core.memory.kv_cache_manager import KVCacheManager
from paged_core.memory.kv_groups import KVCacheGroup, KVCacheGroups
from paged_core.sched.request import Request


# ---- grouping ---------------------------------------------------------------
def test_two_sliding_to_one_full_makes_three_groups_of_two_layers() -> None:
    """Gemma-3-like interleave (here 2 sliding : 1 full): gcd(4, 2) = 2 layers per group, so every group has
    one layer per cache tensor and a block costs the same whichever group holds it."""
    groups = KVCacheGroups.from_windows([512, 512, None, 512, 512, None])
    assert groups.groups == (
        KVCacheGroup((0, 1), 512),
        KVCacheGroup((3, 4), 512),
        KVCacheGroup((2, 5), None),
    )
    assert groups.layer_group == (0, 0, 2, 1, 1, 2)
    assert groups.layer_tensor == (0, 1, 0, 0, 1, 1)
    assert groups.num_groups == 3 and groups.num_tensors == 2 and groups.tensor_layers() == [0, 1]
    assert groups.is_hybrid and groups.has_sliding and groups.num_full == 1


def test_three_sliding_and_two_full_layers_make_five_groups_of_one() -> None:
    groups = KVCacheGroups.from_windows([8, None, 8, None, 8])
    assert [g.layers for g in groups.groups] == [(0,), (2,), (4,), (1,), (3,)]
    assert [g.sliding_window for g in groups.groups] == [8, 8, 8, None, None]
    assert groups.num_tensors == 1 and groups.layer_tensor == (0,) * 5
    assert groups.layer_group == (0, 3, 1, 4, 2) and groups.num_full == 2


def test_alike_layers_make_one_group_whatever_their_window() -> None:
    full, sliding = KVCacheGroups.from_windows([None] * 4), KVCacheGroups.from_windows([64] * 3)
    assert full == KVCacheGroups.single(4) and not full.is_hybrid and not full.has_sliding
    assert sliding == KVCacheGroups.single(3, 64) and not sliding.is_hybrid and sliding.has_sliding
    with pytest.raises(UnsupportedConfigError, match="at least one attention layer"):
        KVCacheGroups.from_windows([])


def test_layers_sharing_a_cache_tensor_must_agree_on_their_shape() -> None:
    """Layers 2 and 3 share tensor 1 (layer 1 of each group): their KV shapes must match, and the error
    names both; shapes may differ between tensors."""
    ok = KVCacheGroups.from_windows([8, 8, None, None], [(4, 64), (2, 128), (4, 64), (2, 128)])
    assert ok.layer_tensor == (0, 1, 0, 1)
    with pytest.raises(UnsupportedConfigError, match=r"layer 3 \(full attention\) has KV shape \(4, 128\) but layer 1"):
        KVCacheGroups.from_windows([8, 8, None, None], [(4, 64), (2, 128), (4, 64), (4, 128)])
    with pytest.raises(UnsupportedConfigError, match=r"layer 1 \(sliding window 8\) has KV shape"):
        KVCacheGroups.from_windows([None, 8], [(4, 64), (4, 80)])


def test_from_specs_groups_attention_layers_by_window() -> None:
    specs = [AttentionSpec(8, 4, 64, sliding_window=w) for w in (32, None, 32, None)]
    groups = KVCacheGroups.from_specs(specs)
    assert [(g.layers, g.sliding_window) for g in groups.groups] == [((0, 2), 32), ((1, 3), None)]
    with pytest.raises(UnsupportedConfigError, match="layer 1"):
        KVCacheGroups.from_specs([AttentionSpec(8, 4, 64, sliding_window=32), AttentionSpec(8, 2, 64)])


def test_window_blocks_and_first_needed_block() -> None:
    sliding, full = KVCacheGroup((0,), 16), KVCacheGroup((1,))
    # A query at position p sees p-15..p: over blocks of 16 that is at most two blocks, one more for the chunk.
    assert (
        sliding.window_blocks(16, 1) == 2 and sliding.window_blocks(16, 17) == 3 and full.window_blocks(16, 1) is None
    )
    assert [sliding.first_needed_block(n, 16) for n in (0, 15, 16, 31, 32, 40)] == [0, 0, 0, 1, 1, 1]
    assert full.first_needed_block(1000, 16) == 0


# ---- the manager with sliding groups ----------------------------------------
BS = 16


def make(windows: list[int | None], num_blocks: int, block_size: int = BS) -> KVCacheManager:
    return KVCacheManager(
        CacheConfig(num_blocks=num_blocks, block_size=block_size), groups=KVCacheGroups.from_windows(windows)
    )


def tokens(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i * 31) % 1009 for i in range(n)]


def prefill(kv: KVCacheManager, req: Request) -> int:
    """Admit with prefix hits and compute every known token in one step; returns the hit tokens."""
    hits, n = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - n, hits) is not None
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)
    return n


def decode(kv: KVCacheManager, req: Request, token: int) -> None:
    """Sample ``token`` and compute it (one decode step)."""
    req.all_token_ids.append(token)
    assert kv.allocate_slots(req, 1) is not None, f"no room to decode position {req.num_computed_tokens}"
    req.num_computed_tokens += 1
    kv.cache_computed_blocks(req)


def held(kv: KVCacheManager, req: Request) -> list[int]:
    """Real blocks ``req`` holds per group."""
    return [sum(1 for b in t if b) for t in kv.block_ids(req)]


def check_accounting(kv: KVCacheManager) -> None:
    """Free blocks plus the blocks held (counted once each) make up the usable blocks."""
    in_use = {b.block_id for tables in kv.req_to_blocks.values() for t in tables for b in t if not b.is_null}
    assert kv.num_free_blocks + len(in_use) == kv.pool.num_usable_blocks
    assert all(kv.pool.blocks[i].ref_cnt > 0 for i in in_use)


def test_a_sliding_request_holds_only_its_window() -> None:
    """Window 16, blocks of 16: a 40-token prompt then 300 decoded tokens never hold more than 3 blocks (the
    prompt's, before the first release) and then at most 2, in a cache far smaller than the sequence."""
    kv = make([16], num_blocks=6)  # 5 usable blocks; the sequence spans 22
    a = Request("a", tokens(40))
    prefill(kv, a)
    most = held(kv, a)[0]
    assert most == 3
    for i in range(300):
        decode(kv, a, 7 + i % 5)
        (table,) = kv.block_ids(a)
        first = max(0, a.num_computed_tokens - 1 - 15) // BS  # the window of the position just computed
        assert all(b == 0 for b in table[:first]) and all(table[first:]), table
        assert len(table) == -(-a.num_computed_tokens // BS)
        assert held(kv, a)[0] <= 2
        check_accounting(kv)
    assert a.num_computed_tokens == 340


def test_a_second_request_hits_only_the_blocks_its_window_needs() -> None:
    """After the sequence above, the same 340 tokens plus one hit 336 tokens with a single real block (block
    20, the window of position 336): the 20 blocks before it were reused long ago and are not needed."""
    kv = make([16], num_blocks=8)
    a = Request("a", tokens(40))
    prefill(kv, a)
    for i in range(300):
        decode(kv, a, 7 + i % 5)
    assert len(kv.pool.cached) < 21  # most of a's blocks were evicted: a full-attention model would hit little
    b = Request("b", [*a.all_token_ids, 1])
    (hits,), n = kv.get_computed_blocks(b)
    assert n == 336
    assert [blk.is_null for blk in hits] == [True] * 20 + [False]
    assert hits[20] is kv.req_to_blocks["a"][0][20]  # shared with a, which still attends to it
    assert kv.allocate_slots(b, b.num_tokens - n, [hits]) is not None
    assert held(kv, b) == [2] and hits[20].ref_cnt == 2
    check_accounting(kv)
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == kv.pool.num_usable_blocks


def test_hybrid_hit_is_limited_by_the_sliding_groups_window() -> None:
    """Full group [None] and a window of 16: while ``a`` decodes in a tight pool the full group keeps every block
    and the sliding group's early blocks are reused. A short prefix of ``a`` then hits nothing (its window's
    sliding blocks are gone though the full group has them all); a long one hits every block."""
    kv = make([None, 16], num_blocks=14)  # 13 usable: the full group holds 9, the sliding group 2 and
    a = Request("a", tokens(40))  # its released blocks are reused soon
    prefill(kv, a)
    for i in range(100):
        decode(kv, a, 3 + i % 4)
        check_accounting(kv)
    assert held(kv, a) == [9, 2]
    short = Request("s", a.all_token_ids[:50])
    full_cached = [kv._key(0, h) in kv.pool.cached for h in kv.update_block_hashes(short)[:3]]
    sliding_cached = [kv._key(1, h) in kv.pool.cached for h in short.block_hashes[:3]]
    assert full_cached == [True] * 3 and sliding_cached == [False] * 3  # the scenario holds
    assert kv.get_computed_blocks(short) == ([[], []], 0)
    long = Request("l", a.all_token_ids[:130])
    hits, n = kv.get_computed_blocks(long)
    assert n == 128
    assert hits[0] == kv.req_to_blocks["a"][0][:8]
    assert [b.block_id for b in hits[1]] == [0] * 7 + [kv.block_ids(a)[1][7]]


def test_hybrid_hit_is_limited_by_the_full_group() -> None:
    """``a`` (128 tokens) is freed; a filler then evicts the full group's last 3 blocks (freed tail first, the
    full group first) while the sliding group keeps all. The hit is the full group's 5 blocks, though the
    sliding group alone could serve 8."""
    kv = make([None, 16], num_blocks=24)
    a = Request("a", tokens(128))
    prefill(kv, a)
    untouched = kv.num_free_blocks
    a_tables = [list(t) for t in kv.req_to_blocks["a"]]
    a_keys = [[blk.block_hash for blk in t] for t in a_tables]
    kv.free(a)
    filler = Request("f", tokens(16 * (untouched + 3) // 2, seed=5))  # 2 groups: untouched + 3 blocks
    assert prefill(kv, filler) == 0 and sum(held(kv, filler)) == untouched + 3
    # The scenario holds: the full group's last 3 blocks now hold the filler's KV; the sliding group's are a's.
    assert [blk.block_hash == k for blk, k in zip(a_tables[0], a_keys[0], strict=True)] == [True] * 5 + [False] * 3
    assert [blk.block_hash for blk in a_tables[1]] == a_keys[1]
    b = Request("b", [*a.all_token_ids, 9])
    hits, n = kv.get_computed_blocks(b)
    assert n == 80
    assert hits[0] == a_tables[0][:5]
    assert hits[1] == [kv.pool.null_block] * 4 + [a_tables[1][4]]


def test_hybrid_prefix_hit_never_hands_one_group_another_groups_hit() -> None:
    """Admission with hits must take every group's hit blocks out of the free queue before allocating any new
    block: else group 0's new block can be group 1's hit (still free), and two groups share one block.

    Found by the hybrid state machine. Reproduction: windows [None, 4, 4], block size 2, 10 blocks; ``a`` = 4
    tokens and ``c`` = 2 tokens computed and freed; ``b`` = a's tokens + 1: hits [[1, 2], [3, 4], [5, 6]], and
    b's tables came out [[1, 2, 4], [3, 4, 6], [5, 6, 7]]: block 4 is group 0's new block and group 1's hit.
    """
    kv = make([None, 4, 4], num_blocks=10, block_size=2)
    a, c = Request("a", [0, 1, 2, 3]), Request("c", [50, 51])
    prefill(kv, a)
    prefill(kv, c)
    kv.free(a)
    kv.free(c)
    b = Request("b", [0, 1, 2, 3, 4])
    hits, n = kv.get_computed_blocks(b)
    assert n == 4 and [[x.block_id for x in h] for h in hits] == [[1, 2], [3, 4], [5, 6]]
    assert kv.allocate_slots(b, 1, hits) is not None
    ids = [i for t in kv.block_ids(b) for i in t]
    assert len(ids) == len(set(ids)), f"a block is in two groups of one request: {kv.block_ids(b)}"
    assert all(kv.pool.blocks[i].ref_cnt == 1 for i in ids)
    check_accounting(kv)


# ---- the hit against its definition, over arbitrary cache contents ------------
WINDOW_SETS = ([None, 3], [2, None, 2], [None, 5, 2], [4], [3, 3, None, None])


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    windows=st.sampled_from(WINDOW_SETS),
    block_size=st.sampled_from([1, 2, 4]),
    length=st.integers(1, 40),
    cached=st.lists(st.booleans(), min_size=200, max_size=200),
)
def test_hit_is_the_longest_prefix_every_group_can_serve(
    windows: list[int | None], block_size: int, length: int, cached: list[bool]
) -> None:
    """Seed the cache with an arbitrary set of (group, block) entries of one prompt; the hit must be the
    longest whole-block prefix (never the last token) for which every full group has all its blocks and every
    sliding group the blocks of the window of the first token after it, and hand out exactly those blocks."""
    kv = make(windows, num_blocks=220, block_size=block_size)
    req = Request("r", tokens(length))
    hashes = kv.update_block_hashes(req)
    groups = kv.groups.groups
    have = {(g, i) for g in range(len(groups)) for i in range(len(hashes)) if cached[g * 40 + i]}
    for g, i in sorted(have):
        (block,) = kv.pool.get_new_blocks(1)
        kv.pool.cache_block(block, kv._key(g, hashes[i]))
        kv.pool.free_blocks([block])

    def serves(n: int) -> bool:
        return all(
            all((g, i) in have for i in range(grp.first_needed_block(n * block_size, block_size), n))
            for g, grp in enumerate(groups)
        )

    want = max(n for n in range((length - 1) // block_size + 1) if serves(n))
    hits, got = kv.get_computed_blocks(req)
    assert got == want * block_size
    for g, grp in enumerate(groups):
        first = grp.first_needed_block(got, block_size)
        assert len(hits[g]) == want
        assert all(b.is_null for b in hits[g][:first])
        assert [b.block_hash for b in hits[g][first:]] == [kv._key(g, h) for h in hashes[first:want]]
