"""The KV-cache manager: per-request block lists, prefix hits, allocation, copy-on-write and forks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from paged_core.config import CacheConfig
from paged_core.memory.block import KVBlock
from paged_core.memory.block_pool import BlockPool
from paged_core.memory.hashing import ROOT_HASH, make_block_hash_fn
from paged_core.memory.kv_groups import KVCacheGroups
from paged_core.memory.sequence import CachedSequence
from paged_core.memory.stats import PrefixCacheStats

ExtraKeyProvider = Callable[[CachedSequence, int], tuple[Any, ...]]
"""``provider(request, block_index) -> extra keys`` mixed into that block's hash."""

GroupBlocks = list[list[KVBlock]]
"""A request's blocks, one list per KV-cache group (a sliding group's blocks behind its window are the null block)."""

_NOTHING_NEW: GroupBlocks = []


class KVCacheManager:
    """Maps requests to blocks in a :class:`BlockPool`, one block table per KV-cache group.

    ``allocate_slots`` either succeeds or returns ``None`` having changed
    nothing it would need back. Writes into a block shared with another
    request (after :meth:`fork`) copy it first: the copy is queued in
    ``pending_copies`` for the backend's ``copy_blocks`` and the request's table
    entry is replaced. A sliding-window group gives back each block once no
    query to come can see it (its table entry becomes the null block), so a
    request holds only its window there.
    """

    def __init__(
        self,
        config: CacheConfig,
        extra_key_providers: Sequence[ExtraKeyProvider] = (),
        groups: KVCacheGroups | None = None,
    ) -> None:
        self.config = config
        self.block_size, num_blocks = config.require_resolved("KVCacheManager")
        self.enable_caching = config.enable_prefix_caching
        self.pool = BlockPool(num_blocks, config.enable_prefix_caching)
        self.hash_fn = make_block_hash_fn(config.hash_algorithm)
        self.extra_key_providers = list(extra_key_providers)
        self.groups = groups if groups is not None else KVCacheGroups.single()
        self.num_groups = self.groups.num_groups
        self._sliding = [g for g, grp in enumerate(self.groups.groups) if grp.sliding_window is not None]
        self._full = [g for g, grp in enumerate(self.groups.groups) if grp.sliding_window is None]
        self.req_to_blocks: dict[str, GroupBlocks] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()
        self.pending_copies: list[tuple[int, int]] = []
        self.pending_replacements: dict[str, list[tuple[int, int, int]]] = {}
        # Copy sources keep a reference until their copies are handed out, so
        # none of them can be reallocated (and become a copy destination) in the
        # same step: the pairs of one copy_blocks call stay independent.
        self._pinned: list[KVBlock] = []
        self._pins: dict[int, int] = {}

    # ---- prefix cache -------------------------------------------------
    def _extra_keys(self, req: CachedSequence, index: int) -> tuple[Any, ...]:
        keys: tuple[Any, ...] = ()
        if index == 0:
            # The chain carries block 0's keys into every later hash.
            if req.cache_salt is not None:
                keys += (("salt", req.cache_salt),)
            if req.lora_id is not None:
                keys += (("lora", req.lora_id),)
            if req.extra_keys:
                keys += (("extra", req.extra_keys),)
        for provider in self.extra_key_providers:
            keys += tuple(provider(req, index))
        return keys

    def update_block_hashes(self, req: CachedSequence) -> list[bytes]:
        """Extend ``req.block_hashes`` to every full block of its known tokens."""
        bs, hashes, tokens = self.block_size, req.block_hashes, req.all_token_ids
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(self.hash_fn(parent, tokens[i * bs : (i + 1) * bs], self._extra_keys(req, i)))
        return hashes

    def _key(self, group: int, block_hash: bytes) -> bytes:
        """The pool's index key of a block of ``group`` (groups hold different layers: never each other's hits)."""
        return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")

    def get_computed_blocks(self, req: CachedSequence) -> tuple[GroupBlocks, int]:
        """Longest cached prefix of a request being admitted: (blocks per group, tokens).

        The last token is never a hit: its logits are needed, so at most
        ``num_tokens - 1`` tokens (in whole blocks) are served from cache. A
        full-attention group needs every block of the prefix cached; a sliding
        group only the blocks the next token's window sees (the peers' rule), so
        the hit is the longest prefix every group can serve.
        """
        if not self.enable_caching:
            return [[] for _ in range(self.num_groups)], 0
        hashes = self.update_block_hashes(req)
        cached, key = self.pool.cached, self._key
        n = (req.num_tokens - 1) // self.block_size
        for g in self._full:
            k = 0
            while k < n and key(g, hashes[k]) in cached:
                k += 1
            n = k
        lowered = bool(self._sliding)
        while lowered:  # each sliding group may lower the hit; stop when all agree
            lowered = False
            for g in self._sliding:
                m = self._sliding_hit(g, hashes, n)
                if m < n:
                    n, lowered = m, True
        hits: GroupBlocks = []
        null = self.pool.null_block
        for g, group in enumerate(self.groups.groups):
            first = group.first_needed_block(n * self.block_size, self.block_size)
            hits.append([null] * first + [cached[key(g, hashes[i])] for i in range(first, n)])
        return hits, n * self.block_size

    def _sliding_hit(self, g: int, hashes: list[bytes], n: int) -> int:
        """The longest hit of at most ``n`` blocks whose window blocks group ``g`` has cached."""
        cached, key, group, bs = self.pool.cached, self._key, self.groups.groups[g], self.block_size
        while n > 0:
            first = group.first_needed_block(n * bs, bs)
            missing = next((i for i in range(n - 1, first - 1, -1) if key(g, hashes[i]) not in cached), None)
            if missing is None:
                return n
            n = missing  # a hit ending past a missing block would need it in its window: end before it
        return 0

    def cache_computed_blocks(self, req: CachedSequence) -> None:
        """Index the request's full blocks whose KV has been computed (call after the step ran)."""
        if not self.enable_caching:
            return
        tables = self.req_to_blocks.get(req.request_id)
        if tables is None:
            return
        n_full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(req.request_id, 0)
        if n_full <= start:
            return
        hashes = self.update_block_hashes(req)
        for g, blocks in enumerate(tables):
            for i in range(start, n_full):
                if not blocks[i].is_null:
                    self.pool.cache_block(blocks[i], self._key(g, hashes[i]))
        self.num_cached_blocks[req.request_id] = n_full

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; returns False (and changes nothing) while any block is in use."""
        ok = self.pool.reset_prefix_cache()
        if ok:
            self.stats.reset()
        return ok

    # ---- allocation ---------------------------------------------------
    def allocate_slots(
        self,
        req: CachedSequence,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVBlock]] = (),
        num_lookahead_tokens: int = 0,
    ) -> GroupBlocks | None:
        """Make room for ``num_new_tokens`` (+ lookahead) after the computed ones.

        ``new_computed_blocks`` are prefix hits (per group) from
        :meth:`get_computed_blocks` for a request being admitted. Returns the
        newly allocated blocks per group (an empty list when no group gained
        any), or ``None`` when the pool cannot supply them: then nothing
        changed but the release of blocks no window sees any more.
        """
        bs = self.block_size
        rid = req.request_id
        tables = self.req_to_blocks.get(rid)
        hits = new_computed_blocks if any(new_computed_blocks) else ()
        if tables is not None and not hits:
            if self._sliding:
                self._release_behind_windows(tables, req.num_computed_tokens)
            # Hot path (every running request, every step): room already there and nothing shared.
            start = req.num_computed_tokens
            end = start + num_new_tokens
            first, last = start // bs, (end - 1) // bs
            room = end + num_lookahead_tokens
            if all(
                room <= len(blocks) * bs
                and blocks[first].ref_cnt == 1
                and (first == last or all(blocks[i].ref_cnt == 1 for i in range(first + 1, last + 1)))
                for blocks in tables
            ):
                return _NOTHING_NEW
        admitting = tables is None
        if tables is None:
            tables = [[] for _ in range(self.num_groups)]
        num_hit = len(hits[0]) if hits else 0
        num_computed = req.num_computed_tokens + num_hit * bs
        write_end = num_computed + num_new_tokens
        need = -(-(write_end + num_lookahead_tokens) // bs)
        pins = self._pins
        plan: list[tuple[int, list[int]]] = []  # per group: blocks to add, table indices to copy on write
        total = 0
        for blocks in tables:
            num_new_blocks = max(0, need - len(blocks) - num_hit)
            # Shared blocks about to be written must be copied first (copy-on-write).
            cow = [
                i
                for i in range(num_computed // bs, min(len(blocks), -(-write_end // bs)))
                if blocks[i].ref_cnt - pins.get(blocks[i].block_id, 0) > 1
            ]
            plan.append((num_new_blocks, cow))
            total += num_new_blocks + len(cow)
        if total == 0 and not admitting:
            return _NOTHING_NEW
        evictable_hits = sum(1 for group_hits in hits for b in group_hits if b.ref_cnt == 0 and not b.is_null)
        if total + evictable_hits > self.pool.num_free_blocks:
            return None

        if admitting:
            self.req_to_blocks[rid] = tables
            self.num_cached_blocks[rid] = num_hit
            if self.enable_caching:
                self.stats.record(req.num_tokens, num_computed, preempted=req.num_preemptions > 0)
        # Every group's hits leave the free queue before any group takes new blocks from it (a hit of one
        # group may sit in the free queue where another group's allocation would hand it out).
        for group_hits in hits:
            self.pool.touch(b for b in group_hits if not b.is_null)
        gained: GroupBlocks = []
        for g, (blocks, (num_new_blocks, cow)) in enumerate(zip(tables, plan, strict=True)):
            if hits:
                blocks.extend(hits[g])
            for i in cow:
                (fresh,) = self.pool.get_new_blocks(1)
                old = blocks[i]
                self.pending_copies.append((old.block_id, fresh.block_id))
                self.pending_replacements.setdefault(rid, []).append((g, i, fresh.block_id))
                blocks[i] = fresh
                self._pinned.append(old)  # this request's reference now pins the source
                pins[old.block_id] = pins.get(old.block_id, 0) + 1
            new_blocks = self.pool.get_new_blocks(num_new_blocks)
            blocks.extend(new_blocks)
            gained.append(new_blocks)
        return gained if any(gained) else _NOTHING_NEW

    def _release_behind_windows(self, tables: GroupBlocks, num_computed: int) -> None:
        """Give back each sliding group's blocks that no query at ``num_computed`` or later can see."""
        null, bs = self.pool.null_block, self.block_size
        for g in self._sliding:
            blocks = tables[g]
            first = min(self.groups.groups[g].first_needed_block(num_computed, bs), len(blocks))
            gone = [blocks[i] for i in range(first) if not blocks[i].is_null]
            if gone:
                for i in range(first):
                    blocks[i] = null
                # Oldest last: the tail of the free queue is evicted last, so a prefix hit finds them longest.
                self.pool.free_blocks(reversed(gone))

    def fork(self, parent: CachedSequence, child: CachedSequence) -> None:
        """Give ``child`` the parent's blocks by reference; later writes copy on demand."""
        tables = self.req_to_blocks[parent.request_id]
        if child.request_id in self.req_to_blocks:
            raise ValueError(f"request {child.request_id!r} already holds blocks")
        for blocks in tables:
            self.pool.touch(b for b in blocks if not b.is_null)
        self.req_to_blocks[child.request_id] = [list(blocks) for blocks in tables]
        self.num_cached_blocks[child.request_id] = self.num_cached_blocks.get(parent.request_id, 0)

    def free(self, req: CachedSequence) -> None:
        """Release the request's blocks, tail first, so its prefix outlives its tail in the LRU queue."""
        tables = self.req_to_blocks.pop(req.request_id, None)
        self.num_cached_blocks.pop(req.request_id, None)
        self.pending_replacements.pop(req.request_id, None)
        if not tables:
            return
        held = [b for blocks in tables for b in reversed(blocks) if not b.is_null]
        if held:
            self.pool.free_blocks(held)
            if self.pending_copies:
                # Copies into blocks this request just gave up are stale: drop them, so a
                # block reallocated in the same step is never a destination twice.
                gone = {b.block_id for b in held if b.ref_cnt == 0}
                self.pending_copies = [(s, d) for s, d in self.pending_copies if d not in gone]

    # ---- views --------------------------------------------------------
    def block_ids(self, req: CachedSequence) -> list[list[int]]:
        """The request's block ids per group, in table order (0: released behind a window)."""
        return [[b.block_id for b in blocks] for blocks in self.req_to_blocks.get(req.request_id, ())]

    def take_copies(self) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int, int]]]]:
        """Drain the block copies and table replacements ((group, index, new block id)) queued since the last call.

        Call once per step, after all allocation; releases the copy sources' pins.
        """
        copies, repl = self.pending_copies, self.pending_replacements
        self.pending_copies, self.pending_replacements = [], {}
        if self._pinned:
            self.pool.free_blocks(self._pinned)
            self._pinned, self._pins = [], {}
        return copies, repl

    @property
    def usage(self) -> float:
        """Fraction of usable KV blocks in use (every group's)."""
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def blocks_needed(self, num_tokens: int, chunk: int = 1) -> int:
        """Blocks one request of ``num_tokens`` tokens holds, over all groups, when its last step computes
        ``chunk`` tokens (a sliding group holds at most its window's blocks)."""
        full = -(-num_tokens // self.block_size)
        total = 0
        for group in self.groups.groups:
            window = group.window_blocks(self.block_size, min(chunk, num_tokens))
            total += full if window is None else min(full, window)
        return total

    def max_chunk(self, num_computed: int, num_new: int, lookahead: int = 0, max_len: int | None = None) -> int:
        """The most of ``num_new`` tokens after ``num_computed`` whose blocks a request alone could hold, with up
        to ``lookahead`` slots after them that never pass ``max_len`` (with sliding groups a long chunk can
        outgrow the cache although the whole sequence fits). At least 1 while ``num_computed < max_len`` for a
        ``max_len`` whose last token fits (see the scheduler's length cap)."""
        if not self._sliding:
            return num_new
        usable = self.pool.num_usable_blocks

        def fits(m: int) -> bool:
            la = lookahead if max_len is None else max(0, min(lookahead, max_len - num_computed - m))
            return self.blocks_needed(num_computed + m + la, m + la) <= usable

        if fits(num_new):
            return num_new
        lo, hi = 0, num_new  # what a chunk needs grows with it: the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo
