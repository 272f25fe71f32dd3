"""Bad input is refused with a message naming the problem: capabilities, debug bounds checks, indices."""

from __future__ import annotations

import pytest
import torch

from paged_backend_cpu import CpuBackend, ops
from paged_core.api import AttentionSpec, UnsupportedConfigError

from .conftest import make_paged_batch


def test_capability_check_names_the_supported_values() -> None:
    caps = CpuBackend.capabilities()
    sizes = r"\[64, 80, 96, 128, 256\]"
    with pytest.raises(UnsupportedConfigError, match=rf"head_size 72 not supported \(supported: {sizes}\)"):
        caps.check(AttentionSpec(4, 2, 72), torch.float32, 16)
    with pytest.raises(UnsupportedConfigError, match=r"block_size 8 not supported \(supported: \[16, 32, 64, 128\]\)"):
        caps.check(AttentionSpec(4, 2, 64), torch.float32, 8)
    with pytest.raises(UnsupportedConfigError, match=r"dtype torch.float64 not supported \(supported: bfloat16"):
        caps.check(AttentionSpec(4, 2, 64), torch.float64, 16)
    with pytest.raises(UnsupportedConfigError, match=r"kv_cache_dtype torch.float64 not supported \(supported: "):
        caps.check(AttentionSpec(4, 2, 64), torch.float32, 16, kv_cache_dtype=torch.float64)
    # Declared: windows, soft caps and quantized caches pass the check.
    caps.check(AttentionSpec(4, 2, 256, sliding_window=8, logits_soft_cap=50.0), torch.bfloat16, 16, torch.int8)


def test_kernel_refuses_bad_window_soft_cap_and_cache_dtype() -> None:
    b = make_paged_batch([1], [5])
    md = b.metadata
    args = (md.query_start_loc, md.seq_lens, md.block_table, 0.1, 0)
    with pytest.raises(RuntimeError, match=r"sliding_window must be >= 0 \(0: none\), got -1"):
        ops.attention(b.query, b.cache, *args, -1)
    with pytest.raises(RuntimeError, match=r"soft_cap must be >= 0 \(0: none\), got -2"):
        ops.attention(b.query, b.cache, *args, 0, -2.0)
    with pytest.raises(RuntimeError, match=r"kv_cache dtype Double not supported \(supported: float32, .*float8_e5m2"):
        ops.attention(b.query, b.cache.double(), *args)


def test_kernel_refuses_an_undeclared_head_size() -> None:
    """Even called directly (no capability check first), the op refuses instead of reading out of bounds."""
    b = make_paged_batch([1], [5], head_size=64)
    md = b.metadata
    with pytest.raises(RuntimeError, match=r"head_size 72 not supported \(supported: 64, 80, 96, 128, 256\)"):
        ops.attention(
            torch.zeros(1, 6, 72), torch.zeros(2, 4, 2, 16, 72), md.query_start_loc, md.seq_lens, md.block_table, 0.1
        )


def _corrupt(batch_args: tuple[list[int], list[int]]) -> tuple[object, torch.Tensor]:
    b = make_paged_batch(*batch_args)
    table = b.metadata.block_table.clone()
    table[1, 1] = b.cache.shape[1] + 5  # a block id past the end of the cache
    return b, table


def test_debug_switch_bounds_checks_block_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    b, table = _corrupt(([1, 1], [20, 30]))
    md = b.metadata  # type: ignore[attr-defined]
    monkeypatch.setenv("PAGED_CPU_DEBUG", "1")
    with pytest.raises(RuntimeError, match=r"block_table\[1\]\[1\] = \d+ is out of range for a cache of \d+ blocks"):
        ops.attention(b.query, b.cache, md.query_start_loc, md.seq_lens, table, 0.125)  # type: ignore[attr-defined]
    table[1, 1] = -1
    with pytest.raises(RuntimeError, match=r"block_table\[1\]\[1\] = -1 is out of range"):
        ops.attention(b.query, b.cache, md.query_start_loc, md.seq_lens, table, 0.125)  # type: ignore[attr-defined]


def test_debug_check_ignores_unused_table_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries past a row's last block are never read, so a stale id there is not an error."""
    b = make_paged_batch([1, 1], [20, 3])
    md = b.metadata
    table = md.block_table.clone()
    table[1, 1] = 10_000
    monkeypatch.setenv("PAGED_CPU_DEBUG", "1")
    out = ops.attention(b.query, b.cache, md.query_start_loc, md.seq_lens, table, 0.125)
    assert torch.isfinite(out).all()


def test_structural_errors_are_always_checked() -> None:
    b = make_paged_batch([1, 1], [20, 30])
    md = b.metadata
    with pytest.raises(RuntimeError, match=r"row 1: seq_len 2 < query_len 3"):
        ops.attention(
            torch.zeros(4, 6, 64),
            b.cache,
            torch.tensor([0, 1, 4], dtype=torch.int32),
            torch.tensor([20, 2], dtype=torch.int32),
            md.block_table,
            0.1,
        )
    with pytest.raises(RuntimeError, match=r"row 1: seq_len 999 needs 63 blocks, the block table has 2"):
        ops.attention(
            b.query, b.cache, md.query_start_loc, torch.tensor([20, 999], dtype=torch.int32), md.block_table, 0.1
        )
    with pytest.raises(RuntimeError, match="must be int32 CPU tensors"):
        ops.attention(b.query, b.cache, md.query_start_loc.long(), md.seq_lens, md.block_table, 0.1)


def test_write_kv_refuses_slots_past_the_cache() -> None:
    cache = torch.zeros(2, 3, 2, 16, 64)
    kv = torch.randn(2, 2, 64)
    with pytest.raises(RuntimeError, match=r"slot_mapping\[1\] = 48 is out of range for a cache of 48 slots"):
        ops.write_kv(kv, kv, cache, torch.tensor([0, 48]))
    with pytest.raises(RuntimeError, match=r"key and value must be \[2, 2, 64\]"):
        ops.write_kv(kv[:, :1], kv[:, :1], cache, torch.tensor([0, 1]))


def test_copy_blocks_refuses_out_of_range_pairs() -> None:
    cache = torch.zeros(2, 3, 2, 16, 64)
    with pytest.raises(RuntimeError, match=r"block pair \(1, 3\) out of range for 3 blocks in layer 0"):
        ops.copy_blocks([cache], torch.tensor([[1, 3]]))


def test_isa_switch_refuses_unknown_names() -> None:
    with pytest.raises(RuntimeError, match=r"unknown ISA 'sse9' \(known: auto, "):
        ops.set_isa("sse9")
    assert ops.isa() in ops.supported_isas()
