"""KV cache manager: prefix hits, atomic allocation, LRU order on free, copy-on-write forks."""

from paged_core.config import CacheConfig
from paged_core.memory.kv_cache_manager import KVCacheManager
from paged_core.sched.request import Request

BS = 4


def make(num_blocks: int = 16, caching: bool = True) -> KVCacheManager:
    return KVCacheManager(CacheConfig(num_blocks=num_blocks, block_size=BS, enable_prefix_caching=caching))


def admit_and_compute(kv: KVCacheManager, req: Request) -> None:
    """Admit with prefix hits, compute the rest in one step, index the full blocks."""
    hits, n = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - n, hits) is not None
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)


def test_three_full_blocks_plus_seven_tokens_caches_three_and_leaves_partial_unhashed() -> None:
    kv = KVCacheManager(CacheConfig(num_blocks=16, block_size=8))
    req = Request("a", list(range(3 * 8 + 7)))
    admit_and_compute(kv, req)
    (blocks,) = kv.req_to_blocks["a"]
    assert len(blocks) == 4
    assert all(b.block_hash is not None for b in blocks[:3])
    assert blocks[3].block_hash is None
    assert len(kv.pool.cached) == 3


def test_second_request_with_same_prefix_hits_those_blocks() -> None:
    kv = KVCacheManager(CacheConfig(num_blocks=16, block_size=8))
    a = Request("a", list(range(31)))
    admit_and_compute(kv, a)
    b = Request("b", [*range(24), 900, 901, 902])
    hits, n = kv.get_computed_blocks(b)
    assert hits == [kv.req_to_blocks["a"][0][:3]] and n == 24
    kv.allocate_slots(b, b.num_tokens - n, hits)
    assert [x.ref_cnt for x in hits[0]] == [2, 2, 2]
    assert kv.stats.hits == 24 and kv.stats.queries == 31 + 27


def test_free_order_is_lru_with_each_requests_tail_first() -> None:
    kv = make()
    a, b = Request("a", list(range(100, 112))), Request("b", list(range(200, 212)))
    admit_and_compute(kv, a)
    admit_and_compute(kv, b)
    (a_ids,), (b_ids,) = kv.block_ids(a), kv.block_ids(b)
    untouched = [blk.block_id for blk in kv.pool.free_queue]
    kv.free(a)
    kv.free(b)
    order = [blk.block_id for blk in kv.pool.free_queue]
    assert order == untouched + a_ids[::-1] + b_ids[::-1]


def test_failed_allocation_changes_nothing() -> None:
    kv = make(num_blocks=6)  # 5 usable
    a = Request("a", list(range(8)))
    admit_and_compute(kv, a)  # 2 blocks, cached
    kv.free(a)  # both free, still cached
    b = Request("b", list(range(8)) + list(range(50, 70)))  # 28 tokens: 2 hits + 5 new blocks > 5 free
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    before = [(blk.block_id, blk.ref_cnt, blk.block_hash) for blk in kv.pool.blocks]
    free_before = [blk.block_id for blk in kv.pool.free_queue]
    assert kv.allocate_slots(b, b.num_tokens - n, hits) is None
    assert [(blk.block_id, blk.ref_cnt, blk.block_hash) for blk in kv.pool.blocks] == before
    assert [blk.block_id for blk in kv.pool.free_queue] == free_before
    assert "b" not in kv.req_to_blocks and kv.stats.requests == 1


def fork_of(kv: KVCacheManager, parent: Request, child_id: str) -> Request:
    """A child sharing the parent's tokens, progress and blocks (what Scheduler.fork does)."""
    child = Request(child_id, parent.prompt_token_ids)
    child.all_token_ids = list(parent.all_token_ids)
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)
    return child


def test_different_cache_salt_never_hits() -> None:
    kv = make()
    admit_and_compute(kv, Request("a", list(range(13)), cache_salt="tenant-1"))
    assert kv.get_computed_blocks(Request("b", list(range(13)), cache_salt="tenant-2"))[1] == 0
    assert kv.get_computed_blocks(Request("c", list(range(13))))[1] == 0
    assert kv.get_computed_blocks(Request("d", list(range(13)), cache_salt="tenant-1"))[1] == 12


def test_lora_and_extra_keys_separate_caches() -> None:
    kv = make()
    admit_and_compute(kv, Request("a", list(range(9)), lora_id=1))
    assert kv.get_computed_blocks(Request("b", list(range(9)), lora_id=2))[1] == 0
    assert kv.get_computed_blocks(Request("c", list(range(9)), lora_id=1))[1] == 8
    assert kv.get_computed_blocks(Request("d", list(range(9)), lora_id=1, extra_keys=("img", "abc")))[1] == 0


def test_extra_key_provider_is_mixed_into_every_block() -> None:
    per_block = {1: ("image", "h1")}
    kv = KVCacheManager(
        CacheConfig(num_blocks=16, block_size=BS),
        extra_key_providers=[lambda req, i: per_block.get(i, ())],
    )
    admit_and_compute(kv, Request("a", list(range(13))))
    assert kv.get_computed_blocks(Request("b", list(range(13))))[1] == 12
    per_block[1] = ("image", "h2")  # a different image in block 1 changes blocks 1 onwards
    assert kv.get_computed_blocks(Request("c", list(range(13))))[1] == 4


def test_fully_cached_prompt_leaves_last_token_to_compute() -> None:
    kv = make()
    admit_and_compute(kv, Request("a", list(range(12))))
    hits, n = kv.get_computed_blocks(Request("b", list(range(12))))
    assert n == 8 and [len(h) for h in hits] == [2]  # the block holding the last token is recomputed


def test_caching_off_gives_no_hits() -> None:
    kv = make(caching=False)
    admit_and_compute(kv, Request("a", list(range(12))))
    assert kv.pool.cached == {}
    assert kv.get_computed_blocks(Request("b", list(range(12)))) == ([[]], 0)


def test_lookahead_slots_are_allocated() -> None:
    kv = make()
    r = Request("a", list(range(4)))
    gained = kv.allocate_slots(r, 4, num_lookahead_tokens=5)
    assert gained is not None and [len(g) for g in gained] == [3]


def test_fork_shares_blocks_and_first_write_copies() -> None:
    kv = make()
    parent = Request("p", list(range(6)))  # 1 full block + 2 tokens
    admit_and_compute(kv, parent)
    parent.all_token_ids.append(77)
    child = fork_of(kv, parent, "c")
    (shared,) = kv.req_to_blocks["p"]
    assert [b.ref_cnt for b in shared] == [2, 2]
    # The child writes token 6 into the shared partial block: it must copy it first.
    assert kv.allocate_slots(child, 1) == []
    copies, repl = kv.take_copies()
    new_last = kv.req_to_blocks["c"][0][1]
    assert copies == [(shared[1].block_id, new_last.block_id)]
    assert repl == {"c": [(0, 1, new_last.block_id)]}
    assert kv.req_to_blocks["c"][0][0] is shared[0] and shared[0].ref_cnt == 2
    assert shared[1].ref_cnt == 1 and new_last.ref_cnt == 1
    # The parent now owns its partial block alone: writing needs no copy.
    assert kv.allocate_slots(parent, 1) == []
    assert kv.take_copies() == ([], {})


def test_usage_tracks_allocation() -> None:
    kv = make(num_blocks=5)
    assert kv.usage == 0.0
    admit_and_compute(kv, Request("a", list(range(8))))
    assert kv.usage == 0.5


def test_three_way_fork_copies_twice_and_pairs_are_independent() -> None:
    kv = make()
    parent = Request("p", list(range(6)))
    admit_and_compute(kv, parent)
    parent.all_token_ids.append(50)
    family = [parent, fork_of(kv, parent, "c0"), fork_of(kv, parent, "c1")]
    shared_partial = kv.req_to_blocks["p"][0][1]
    assert shared_partial.ref_cnt == 3
    for r in family:  # everyone writes position 6 in the same step
        assert kv.allocate_slots(r, 1) == []
    copies, _ = kv.take_copies()
    # The first two writers copy; the last one is then the sole owner and writes in place.
    assert len(copies) == 2 and {s for s, _ in copies} == {shared_partial.block_id}
    dsts = [d for _, d in copies]
    assert len(set(dsts)) == 2 and not set(dsts) & {s for s, _ in copies}
    assert shared_partial.ref_cnt == 1 and kv.req_to_blocks["c1"][0][1] is shared_partial


def test_copies_into_a_freed_request_are_dropped() -> None:
    kv = make()
    parent = Request("p", list(range(6)))
    admit_and_compute(kv, parent)
    parent.all_token_ids.append(50)
    child = fork_of(kv, parent, "c")
    kv.allocate_slots(child, 1)  # child copies the shared partial block
    assert len(kv.pending_copies) == 1
    kv.free(child)  # e.g. preempted later in the same step
    copies, repl = kv.take_copies()
    assert copies == [] and repl == {}
    assert kv.req_to_blocks["p"][0][1].ref_cnt == 1
