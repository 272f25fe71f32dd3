"""The intrusive LRU free queue."""

import pytest

from paged_core.memory.block import FreeBlockQueue, KVBlock


def ids(q: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in q]


def test_popleft_is_fifo_and_remove_from_middle_is_o1_unlink() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4] and len(q) == 4
    assert blocks[2] not in q
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    assert ids(q) == [1, 3, 4, 2]


def test_remove_head_and_tail() -> None:
    blocks = [KVBlock(i) for i in range(3)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[0])
    q.remove(blocks[2])
    assert ids(q) == [1]
    q.remove(blocks[1])
    assert len(q) == 0 and ids(q) == []
    with pytest.raises(IndexError):
        q.popleft()


def test_double_append_and_foreign_remove_raise() -> None:
    b = KVBlock(1)
    q = FreeBlockQueue([b])
    with pytest.raises(ValueError):
        q.append(b)
    with pytest.raises(ValueError):
        q.remove(KVBlock(2))
