"""KV blocks and the LRU free queue (an intrusive doubly linked list)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class KVBlock:
    """One fixed-size KV-cache block.

    ``block_hash`` stays set after the block is freed (lazy eviction): a freed
    block can still be hit by the prefix cache until it is handed out again.
    ``prev_free``/``next_free`` link it into the free queue while its reference
    count is zero.
    """

    __slots__ = ("block_hash", "block_id", "is_null", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.is_null = is_null
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Free blocks in eviction order: the head is evicted first.

    A plain deque cannot remove a block from the middle in O(1), which a
    prefix-cache hit on a freed block needs; the links live in the blocks.
    """

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        # Sentinels avoid None checks on every link update.
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        self.extend(blocks)

    def __len__(self) -> int:
        return self._len

    def popleft(self) -> KVBlock:
        """Remove and return the block to evict next."""
        block = self._head.next_free
        if block is self._tail or block is None:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        """Unlink ``block`` from anywhere in the queue in O(1)."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block!r} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def append(self, block: KVBlock) -> None:
        """Put ``block`` at the tail (evicted last)."""
        if block.prev_free is not None:
            raise ValueError(f"{block!r} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self._len += 1

    def extend(self, blocks: Iterable[KVBlock]) -> None:
        for block in blocks:
            self.append(block)

    def __contains__(self, block: KVBlock) -> bool:
        return block.prev_free is not None

    def __iter__(self) -> Iterator[KVBlock]:
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free
