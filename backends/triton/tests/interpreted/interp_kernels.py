"""Kernel checks against the core reference backend; run only under the Triton interpreter.

The file name does not match ``test_*.py``: the workspace run never imports it in its own process (triton's
mode is fixed per process). ``test_interpreted.py`` runs these in a child process with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import run_case, write

from paged_core.api import AttentionMetadata, AttentionSpec, UnsupportedConfigError
from paged_core.testing import ReferenceBackend
from paged_triton import launch
from paged_triton.tiles import INTERPRET_TILES_ENV


def _run(
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head: int,
    block: int,
    query_lens: list[int],
    seq_lens: list[int],
    scale: float | None = None,
) -> None:
    run_case(dtype, kv_dtype, heads, kv_heads, head, block, query_lens, seq_lens, scale=scale).check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("head", "block"), [(64, 64), (96, 32), (256, 16)])
def test_dtypes_heads_blocks(family: str, dtype: torch.dtype, head: int, block: int) -> None:
    """Mixed batch (decodes, a chunk over cached context, a fresh prompt) per dtype, head and block size."""
    _run(dtype, dtype, 4, 2, head, block, [1, 1, 7, 20], [40, 3, 70, 20])


@pytest.mark.parametrize("group", [1, 2, 16])
def test_gqa_groups(family: str, group: int) -> None:
    """GQA ratios the conformance grid does not sweep (2, 16), and no GQA."""
    _run(torch.float32, torch.float32, 2 * group, 2, 64, 32, [1, 9], [50, 33])


def test_split_k_long_decode(family: str) -> None:
    """A decode past several 256-key partitions goes through split-K and the reduction."""
    _run(torch.float32, torch.float32, 8, 1, 64, 64, [1, 1], [1100, 70])


def test_cache_dtype_differs(family: str) -> None:
    """fp32 compute over a bf16 cache: values are converted on store and load."""
    _run(torch.float32, torch.bfloat16, 4, 2, 80, 16, [1, 5], [20, 18], scale=0.3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_rdna_tiles(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """The tiles launched on RDNA (q.k over head-dim chunks) compute the same attention."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, "rdna")
    _run(dtype, dtype, 4, 2, 64 if dtype == torch.float32 else 256, 16, [1, 6], [300, 40])


def test_rdna_refuses_wide_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 beyond head size 64 spills on RDNA, so it is refused there by name."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, "rdna")
    with pytest.raises(UnsupportedConfigError, match="not supported on RDNA"):
        _run(torch.float32, torch.float32, 2, 2, 128, 16, [1], [5])


def test_padding_slots_are_not_written(family: str) -> None:
    """Slot -1 (padding) writes nothing; copy_blocks copies keys and values."""
    spec = AttentionSpec(2, 2, 64)
    cache = ReferenceBackend("cpu").allocate_kv_cache(4, 16, spec, torch.float32)
    md = AttentionMetadata(
        query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
        seq_lens=torch.tensor([2], dtype=torch.int32),
        block_table=torch.tensor([[1]], dtype=torch.int32),
        slot_mapping=torch.tensor([16, -1]),
        block_size=16,
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=1,
        num_actual_tokens=2,
        max_query_len=2,
        max_seq_len=2,
    )
    kv = torch.ones(2, 2, 64)
    write(kv, 2 * kv, cache, md)
    assert int((cache != 0).sum()) == 2 * 2 * 64, "exactly one token's keys and values must be stored"
    launch.copy_blocks([cache], torch.tensor([[1, 3]]))
    assert torch.equal(cache[:, 3], cache[:, 1]) and float(cache[1, 3, 0, 0, 0]) == 2.0
