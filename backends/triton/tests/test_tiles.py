"""Launch planning: tiles fit their budgets, split plans cover the context, specializations are complete."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import BackendCapabilities, GraphSupport
from paged_triton.backend import QUANTIZED_KV
from paged_triton.specializations import POINTER_TYPES, all_specializations
from paged_triton.tile_shape import MAX_SPLITS
from paged_triton.tiles import FAMILIES, MIN_PARTITION, attention_tiles, dot_fp32, rdna_supported, split_plan

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
CAPS = BackendCapabilities(
    dtypes=DTYPES,
    kv_cache_dtypes=DTYPES | QUANTIZED_KV,
    block_sizes=(16, 32, 64),
    head_sizes=frozenset({64, 80, 96, 128, 256}),
    gqa_ratios=frozenset(range(1, 17)),
    sliding_window=True,
    logits_soft_cap=True,
    graph_support=GraphSupport.ANY,
)
"""What the ROCm backend declares over these kernels (XPU: the same without the quantized KV dtypes)."""


@pytest.mark.parametrize("max_seq_len", [1, 255, 256, 257, 1283, 8192, 100_000])
@pytest.mark.parametrize("rows", [1, 64, 256])
def test_split_plan_covers_every_key(max_seq_len: int, rows: int) -> None:
    """Partitions are block-aligned, at most MAX_SPLITS, and together cover the longest context."""
    splits, partition = split_plan(rows, 8, max_seq_len, 16)
    assert 1 <= splits <= MAX_SPLITS and partition % 16 == 0
    assert splits * partition >= max_seq_len > (splits - 1) * partition
    if max_seq_len <= MIN_PARTITION:
        assert splits == 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("head", [64, 80, 96, 128, 256])
def test_tiles_divide_blocks(family: str, block: int, head: int) -> None:
    """A key tile never straddles two paged blocks, covers the head size, and a q.k chunk divides the head tile."""
    for dtype in DTYPES:
        for decode in (True, False):
            tiles = attention_tiles(dtype, head, block, decode, decode, family)
            assert block % tiles.block_n == 0 and tiles.head_pad >= head
            assert tiles.head_pad % tiles.d_chunk == 0 and tiles.block_m >= 16


@pytest.mark.parametrize("family", FAMILIES)
def test_every_launchable_specialization_is_listed(family: str) -> None:
    """Each (dtype, cache dtype, head, block, mode) the launcher can pick on a family is a listed specialization.

    Compared by what is compiled (constexprs, pointer types, threads), since modes with equal tiles share one.
    """
    specs = all_specializations(CAPS, family)
    compiled = {(s.constexprs, s.pointers[3][1], s.pointers[4][1], s.lanes) for s in specs if s.kernel == "attention"}
    for q in CAPS.dtypes:
        for kv in CAPS.effective_kv_cache_dtypes:
            for head in CAPS.head_sizes or ():
                if family == "rdna" and not rdna_supported(q, head):
                    continue
                for block in CAPS.block_sizes:
                    for decode, split in ((True, False), (True, True), (False, False)):
                        for window, soft_cap in ((False, False), (True, False), (False, True), (True, True)):
                            features = window or soft_cap
                            t = attention_tiles(q, head, block, decode, split, family, kv_dtype=kv, features=features)
                            key = (
                                tuple(t.constexprs(dot_fp32(q, False), window, soft_cap).items()),
                                POINTER_TYPES[q],
                                POINTER_TYPES[kv],
                                t.lanes,
                            )
                            assert key in compiled, (q, kv, head, block, decode, split, window, soft_cap, t)
    assert {s.kernel for s in specs} == {"attention", "reduce", "write_kv", "copy_blocks"}


def test_launch_options_follow_the_family() -> None:
    """NVIDIA attention gets its register cap; Intel launches get their sub-group size; AMD nothing extra."""
    by_family = {f: {s.kernel: dict(s.options) for s in all_specializations(CAPS, f)} for f in FAMILIES}
    assert by_family["nvidia"]["attention"] == {"maxnreg": 255} and by_family["nvidia"]["write_kv"] == {}
    assert by_family["cdna"]["attention"] == {} and by_family["rdna"]["reduce"] == {}
    assert all({"threads_per_warp", "warp_size"} & set(opts) for opts in by_family["xpu"].values())


@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_caches_have_their_own_specializations(family: str) -> None:
    """Each 8-bit cache dtype gets attention, write_kv and copy_blocks variants with its pointer type, and the
    soft cap is compiled as a float argument."""
    specs = all_specializations(CAPS, family)
    for kv in QUANTIZED_KV:
        kinds = {s.kernel for s in specs if POINTER_TYPES[kv] in dict(s.pointers).values()}
        assert kinds == {"attention", "write_kv", "copy_blocks"}, (kv, kinds)
    attention = [s for s in specs if s.kernel == "attention"]
    assert all(
        s.signature(["scale", "soft_cap", "window"]) == {"scale": "fp32", "soft_cap": "fp32", "window": "i32"}
        for s in attention
    )


def test_rdna_quantized_caches_take_narrow_key_tiles() -> None:
    """On RDNA an 8-bit cache's decode tiles are 16 keys wide, its q.k chunks 32, on 512 threads (wider ones
    spilled); other families' tiles do not depend on it."""
    for kv in QUANTIZED_KV:
        t = attention_tiles(torch.bfloat16, 64, 64, True, True, "rdna", kv_dtype=kv)
        assert (t.block_n, t.d_chunk, t.lanes) == (16, 32, 512)
        cdna = attention_tiles(torch.bfloat16, 64, 64, True, True, "cdna", kv_dtype=kv)
        assert cdna == attention_tiles(torch.bfloat16, 64, 64, True, True, "cdna", kv_dtype=torch.bfloat16)


def test_window_and_soft_cap_variants_take_smaller_tiles() -> None:
    """A variant with a window or soft cap keeps half the decode key tile (D64 16-bit: 16 keys, not 32) and,
    on CDNA, prefill over a wider cache takes 16-row tiles (the aot report's SGPR spills)."""
    plain = attention_tiles(torch.bfloat16, 64, 64, True, False, "cdna")
    assert plain.block_n == 32
    assert attention_tiles(torch.bfloat16, 64, 64, True, False, "cdna", features=True).block_n == 16
    wide = attention_tiles(torch.bfloat16, 128, 16, False, False, "cdna", kv_dtype=torch.float32)
    featured = attention_tiles(torch.bfloat16, 128, 16, False, False, "cdna", kv_dtype=torch.float32, features=True)
    assert (wide.block_m, featured.block_m, featured.lanes) == (32, 16, 512)
