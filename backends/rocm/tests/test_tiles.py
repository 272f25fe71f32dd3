"""Launch planning: tiles fit their budgets, split plans cover the context, specializations are complete."""

from __future__ import annotations

import pytest
import torch

from paged_backend_rocm import RocmBackend
from paged_backend_rocm.specializations import all_specializations
from paged_backend_rocm.tiles import MAX_SPLITS, MIN_PARTITION, attention_tiles, split_plan


@pytest.mark.parametrize("max_seq_len", [1, 255, 256, 257, 1283, 8192, 100_000])
@pytest.mark.parametrize("rows", [1, 64, 256])
def test_split_plan_covers_every_key(max_seq_len: int, rows: int) -> None:
    """Partitions are block-aligned, at most MAX_SPLITS, and together cover the longest context."""
    splits, partition = split_plan(rows, 8, max_seq_len, 16)
    assert 1 <= splits <= MAX_SPLITS and partition % 16 == 0
    assert splits * partition >= max_seq_len > (splits - 1) * partition
    if max_seq_len <= MIN_PARTITION:
        assert splits == 1


@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("head", [64, 80, 96, 128, 256])
def test_tiles_divide_blocks(block: int, head: int) -> None:
    """A key tile never straddles two paged blocks, and covers the head size."""
    for decode in (True, False):
        tiles = attention_tiles(torch.bfloat16, head, block, decode, decode)
        assert block % tiles.block_n == 0 and tiles.head_pad >= head


def test_every_launchable_specialization_is_listed() -> None:
    """Each (dtype, cache dtype, head, block, mode) maps to a listed specialization."""
    caps = RocmBackend.capabilities()
    labels = {s.label for s in all_specializations(caps)}
    for q in caps.dtypes:
        for head in caps.head_sizes or ():
            for block in caps.block_sizes:
                for decode, split in ((True, False), (True, True), (False, False)):
                    t = attention_tiles(q, head, block, decode, split)
                    mode = "decode-split" if t.split else "decode" if decode else "prefill"
                    name = str(q).removeprefix("torch.")
                    assert f"attention {mode} q={name} kv={name} D{t.head_pad} M{t.block_m} N{t.block_n}" in labels
    kernels = {s.kernel for s in all_specializations(caps)}
    assert kernels == {"attention", "reduce", "write_kv", "copy_blocks"}
