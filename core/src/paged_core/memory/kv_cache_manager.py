"""The KV-cache manager: per-request block lists, prefix hits, allocation, copy-on-write and forks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from paged_core.config import CacheConfig
from paged_core.memory.block import KVBlock
from paged_core.memory.block_pool import BlockPool
from paged_core.memory.hashing import ROOT_HASH, make_block_hash_fn
from paged_core.memory.sequence import CachedSequence
from paged_core.memory.stats import PrefixCacheStats

ExtraKeyProvider = Callable[[CachedSequence, int], tuple[Any, ...]]
"""``provider(request, block_index) -> extra keys`` mixed into that block's hash."""


class KVCacheManager:
    """Maps requests to blocks in a :class:`BlockPool`.

    ``allocate_slots`` either succeeds or returns ``None`` having changed
    nothing. Writes into a block shared with another request (after
    :meth:`fork`) copy it first: the copy is queued in ``pending_copies`` for
    the backend's ``copy_blocks`` and the request's table entry is replaced.
    """

    def __init__(self, config: CacheConfig, extra_key_providers: Sequence[ExtraKeyProvider] = ()) -> None:
        self.config = config
        self.block_size, num_blocks = config.require_resolved("KVCacheManager")
        self.enable_caching = config.enable_prefix_caching
        self.pool = BlockPool(num_blocks, config.enable_prefix_caching)
        self.hash_fn = make_block_hash_fn(config.hash_algorithm)
        self.extra_key_providers = list(extra_key_providers)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()
        self.pending_copies: list[tuple[int, int]] = []
        self.pending_replacements: dict[str, list[tuple[int, int]]] = {}
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

    def get_computed_blocks(self, req: CachedSequence) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of a request being admitted: (blocks, tokens).

        The last token is never a hit: its logits are needed, so at most
        ``num_tokens - 1`` tokens (in whole blocks) are served from cache.
        """
        if not self.enable_caching:
            return [], 0
        hashes = self.update_block_hashes(req)
        hits: list[KVBlock] = []
        for h in hashes[: (req.num_tokens - 1) // self.block_size]:
            block = self.pool.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def cache_computed_blocks(self, req: CachedSequence) -> None:
        """Index the request's full blocks whose KV has been computed (call after the step ran)."""
        if not self.enable_caching:
            return
        blocks = self.req_to_blocks.get(req.request_id)
        if blocks is None:
            return
        n_full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(req.request_id, 0)
        if n_full <= start:
            return
        hashes = self.update_block_hashes(req)
        for i in range(start, n_full):
            self.pool.cache_block(blocks[i], hashes[i])
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
        new_computed_blocks: Sequence[KVBlock] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[KVBlock] | None:
        """Make room for ``num_new_tokens`` (+ lookahead) after the computed ones.

        ``new_computed_blocks`` are prefix hits from :meth:`get_computed_blocks`
        for a request being admitted. Returns the newly allocated blocks, or
        ``None`` (with no side effect) when the pool cannot supply them.
        """
        bs = self.block_size
        rid = req.request_id
        blocks = self.req_to_blocks.get(rid)
        if blocks is not None and not new_computed_blocks:
            # Hot path (every running request, every step): room already there and nothing shared.
            start = req.num_computed_tokens
            end = start + num_new_tokens
            first, last = start // bs, (end - 1) // bs
            if (
                end + num_lookahead_tokens <= len(blocks) * bs
                and blocks[first].ref_cnt == 1
                and (first == last or all(blocks[i].ref_cnt == 1 for i in range(first + 1, last + 1)))
            ):
                return []
        admitting = blocks is None
        if blocks is None:
            blocks = []
        num_computed = req.num_computed_tokens + len(new_computed_blocks) * bs
        write_end = num_computed + num_new_tokens
        num_have = len(blocks) + len(new_computed_blocks)
        num_new_blocks = max(0, -(-(write_end + num_lookahead_tokens) // bs) - num_have)
        # Shared blocks about to be written must be copied first (copy-on-write).
        pins = self._pins
        cow = [
            i
            for i in range(num_computed // bs, min(len(blocks), -(-write_end // bs)))
            if blocks[i].ref_cnt - pins.get(blocks[i].block_id, 0) > 1
        ]
        if num_new_blocks == 0 and not cow and not admitting:
            return []
        evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks + len(cow) + evictable_hits > self.pool.num_free_blocks:
            return None

        if admitting:
            self.req_to_blocks[rid] = blocks
            self.num_cached_blocks[rid] = len(new_computed_blocks)
            if self.enable_caching:
                self.stats.record(req.num_tokens, num_computed, preempted=req.num_preemptions > 0)
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
        for i in cow:
            (fresh,) = self.pool.get_new_blocks(1)
            old = blocks[i]
            self.pending_copies.append((old.block_id, fresh.block_id))
            self.pending_replacements.setdefault(rid, []).append((i, fresh.block_id))
            blocks[i] = fresh
            self._pinned.append(old)  # this request's reference now pins the source
            pins[old.block_id] = pins.get(old.block_id, 0) + 1
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        blocks.extend(new_blocks)
        return new_blocks

    def fork(self, parent: CachedSequence, child: CachedSequence) -> None:
        """Give ``child`` the parent's blocks by reference; later writes copy on demand."""
        blocks = self.req_to_blocks[parent.request_id]
        if child.request_id in self.req_to_blocks:
            raise ValueError(f"request {child.request_id!r} already holds blocks")
        self.pool.touch(blocks)
        self.req_to_blocks[child.request_id] = list(blocks)
        self.num_cached_blocks[child.request_id] = self.num_cached_blocks.get(parent.request_id, 0)

    def free(self, req: CachedSequence) -> None:
        """Release the request's blocks, tail first, so its prefix outlives its tail in the LRU queue."""
        blocks = self.req_to_blocks.pop(req.request_id, None)
        self.num_cached_blocks.pop(req.request_id, None)
        self.pending_replacements.pop(req.request_id, None)
        if blocks:
            self.pool.free_blocks(reversed(blocks))
            if self.pending_copies:
                # Copies into blocks this request just gave up are stale: drop them, so a
                # block reallocated in the same step is never a destination twice.
                gone = {b.block_id for b in blocks if b.ref_cnt == 0}
                self.pending_copies = [(s, d) for s, d in self.pending_copies if d not in gone]

    # ---- views --------------------------------------------------------
    def block_ids(self, req: CachedSequence) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(req.request_id, ())]

    def take_copies(self) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int]]]]:
        """Drain the block copies and table replacements queued since the last call.

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
        """Fraction of usable KV blocks in use."""
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
