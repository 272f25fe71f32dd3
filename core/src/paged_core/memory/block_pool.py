"""The block pool: every KV block, its reference count, the free queue and the hash index."""

from __future__ import annotations

from collections.abc import Iterable

from paged_core.errors import ConfigError, PagedError
from paged_core.memory.block import FreeBlockQueue, KVBlock


class BlockPool:
    """Owns ``num_blocks`` blocks; block 0 is the null block used for padding and never handed out.

    Freed blocks go to the tail of the free queue and keep their hash until
    they are handed out again (lazy eviction), so a later request can still
    hit them.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ConfigError(f"num_blocks must be an int >= 2 (one is the null block), got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[bytes, KVBlock] = {}

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever hold KV (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no reference (cached or not): what an allocation may take."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks currently referenced."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks from the head of the free queue, evicting their hashes."""
        if n > len(self.free_queue):
            raise PagedError(f"asked for {n} blocks, only {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on blocks found by a prefix hit (pulling free ones out of the queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero join the tail in the given order."""
        for block in ordered:
            if block.ref_cnt <= 0:
                raise PagedError(f"double free of {block!r}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Index a full, computed block under ``block_hash``.

        If another block already holds that hash (two requests computed the
        same prefix at once), the index keeps the first and this one stays
        unhashed: it is freed as a plain block.
        """
        if block.block_hash is not None or not self.enable_caching:
            return
        if block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        assert block.block_hash is not None
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refuses (returns False) while any block is in use."""
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        return True
