"""The XPU ahead-of-time check's parsing and spill gate, and the Intel tiles' shapes (no triton-xpu, no ocloc)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from paged_backend_xpu import aot
from paged_triton.tile_shape import DECODE_BLOCK_M, head_pad
from paged_triton.tiles_xpu import XPU_THREADS_PER_WARP, xpu_attention_tiles, xpu_options

SPILL_LOG = """Compilation from IR - skipping loading of FCL

warning: kernel paged_attention_kernel  compiled SIMD16 allocated 128 regs and spilled around 262

Build succeeded.
"""
CLEAN_LOG = "Compilation from IR - skipping loading of FCL\nBuild succeeded.\n"


def _asm(num_grf: int, declares: list[str], spill: int | None = None) -> str:
    head = [
        "//.kernel paged_attention_kernel",
        "//.platform PVCXT",
        f"//.thread_config numGRF={num_grf}, numAcc=4, numSWSB=16",
        "//.instCount 4904",
    ]
    if spill is not None:
        head += ["//.RA type\tGRAPH_COLORING_SPILL_FF_RA", f"//.spill size {spill}"]
    return "\n".join([*head, "", *declares, "", "(W)     mov (16|M0)  r2.0<1>:f  r1.0<1;1,0>:f", ""])


DECLARES = [
    "//.declare BuiltInR0 (0)  rf=r size=64 type=ud align=32 words (r0.0)",
    "//.declare %local_id_x (12)  rf=r size=4 type=ud align=2 words (r1.9)",
    "//.declare %arg (22)  rf=r size=0 type=ud align=32 words (r26.0)",
    "//.declare V0105 (114)  rf=r size=64 type=d align=32 words (spilled -> Scratch[2x64])",
    "//.declare  (5626)  rf=r size=256 type=ud align=32 words (r11.0)",
    "//.declare  (5718)  rf=r size=32 type=ud align=2 words (r127.0)",
    "//.declare BuiltinA0 (2)  rf=a size=4 type=ud align=1 words (a0.0)",
]


def test_ocloc_warning_parsed() -> None:
    """ocloc's spill warning gives kernel, SIMD width, registers and the spill count; a clean build none."""
    [w] = aot.parse_ocloc_log(SPILL_LOG)
    assert w == aot.OclocWarning("paged_attention_kernel", 16, 128, 262)
    assert aot.parse_ocloc_log(CLEAN_LOG) == []


def test_asm_registers_and_spill_bytes() -> None:
    """GRFs covered by allocated variables (multi-register ones counted whole; spilled and address ones not)."""
    stats = aot.parse_asm(_asm(256, DECLARES, spill=16768), grf_bytes=64)
    # r0, r1, r26 (size 0 still marks its register), r11..r14 (256 B), r127
    assert stats == aot.AsmStats(num_grf=256, used_grf=8, spill_bytes=16768)
    # 32-byte registers (dg2): 256 B at r11 cover r11..r18, 64 B at r0 cover r0..r1, and r1.9 (byte 36) is r2
    assert aot.parse_asm(_asm(128, DECLARES), grf_bytes=32) == aot.AsmStats(128, 13, 0)


def test_final_asm_is_the_last_attempt() -> None:
    """IGC numbers its retries (``X_1_simd16...``): the last one is what ships."""
    paths = [
        "/d/OCL_asmab_simd16_entry_0001.asm",
        "/d/OCL_asmab_2_simd16_entry_0001.asm",
        "/d/OCL_asmab_1_simd16_entry_0001.asm",
    ]
    assert aot.final_asm(paths) == "/d/OCL_asmab_2_simd16_entry_0001.asm"
    assert aot.final_asm(["/d/OCL_asmab_simd16_entry_0001.asm"]) == "/d/OCL_asmab_simd16_entry_0001.asm"
    assert aot.final_asm([]) is None


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ("", "default (128)"),
        ("-cl-intel-256-GRF-per-thread", "256"),
        ("-cl-intel-128-GRF-per-thread", "128"),
        (" -cl-intel-enable-auto-large-GRF-mode", "auto"),
        ("-cl-opt-disable -cl-intel-512-GRF-per-thread", "512"),
    ],
)
def test_grf_mode_from_build_flags(flags: str, mode: str) -> None:
    assert aot.grf_mode(flags) == mode


def test_spill_gate() -> None:
    """A row fails on a spill seen by either source, or on a compile error; passes otherwise."""
    clean = aot.measure("k", "pvc", "-cl-intel-256-GRF-per-thread", CLEAN_LOG, _asm(256, DECLARES))
    assert clean.ok and clean.spills == 0 and clean.registers == "8/256" and clean.grf_mode == "256"
    dumped = aot.measure("k", "pvc", "", CLEAN_LOG, _asm(128, DECLARES, spill=100))
    assert not dumped.ok and dumped.spills == 2  # 100 bytes: two 64-byte registers
    warned = aot.measure("k", "dg2", "", SPILL_LOG, _asm(128, DECLARES, spill=0))
    assert not warned.ok and warned.spills == 262
    no_dump = aot.measure("k", "pvc", "", SPILL_LOG, None)
    assert not no_dump.ok and no_dump.registers.startswith("128")
    assert aot.measure("k", "pvc", "", CLEAN_LOG, None).ok
    assert not aot.Resources("k", "pvc", "-", "-", 0, "error: triton: boom").ok


def test_report_lines_and_summary() -> None:
    rows = [
        aot.Resources("attention a", "pvc", "256", "200/256", 0),
        aot.Resources("attention a", "dg2", "256", "256/256", 3, "spill 96 B"),
        aot.Resources("reduce", "pvc", "-", "-", 0, "error: ocloc exit 1"),
    ]
    lines = aot.render(rows)
    assert lines[0].startswith("| kernel | target | GRF mode |") and len(lines) == 2 + len(rows)
    assert lines[2].endswith("| 0 | ok |") and "FAIL spill 96 B" in lines[3] and "FAIL error" in lines[4]
    summary = aot.summarize(rows, kinds=2, targets=2, seconds=12.3)
    assert "3 kernels (2 specializations, 2 targets)" in summary and "registers 200-256" in summary
    assert "1 spilling, 1 compile errors; 2 failing" in summary


def test_missing_ocloc_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aot.OCLOC_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"aot-toolchain\.sh"):
        aot.ocloc_path()
    tool = tmp_path / "ocloc"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert aot.ocloc_path() == tool


def test_refuses_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit) as exc:
        aot.main(["--targets", "pvc"])
    assert exc.value.code == 2


def test_module_imports_no_triton() -> None:
    """The parsing and gate work without triton-xpu: the module imports triton only when it compiles."""
    assert "triton" not in aot.__dict__
    assert all(t.device and t.grf_bytes in (32, 64) for t in aot.TARGETS.values())


HEADS = [64, 80, 96, 128, 256]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("head_size", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("decode", "split"), [(True, False), (True, True), (False, False)])
def test_xpu_tiles_divide_the_block_and_cover_the_head(
    dtype: torch.dtype, head_size: int, block_size: int, decode: bool, split: bool
) -> None:
    """BLOCK_N divides the block, HEAD_PAD covers the head in whole chunks, launch shape fits 256-GRF mode."""
    for kv in DTYPES:
        t = xpu_attention_tiles(dtype, head_size, block_size, decode, split, kv)
        assert block_size % t.block_n == 0 and t.block_n >= 16
        assert t.head_pad == head_pad(head_size) >= head_size
        assert t.head_pad % t.d_chunk == 0 and t.d_chunk >= 16
        assert t.block_m >= DECODE_BLOCK_M and (t.block_m == DECODE_BLOCK_M or not decode)
        assert t.split == (split and decode)
        assert t.lanes % XPU_THREADS_PER_WARP == 0 and t.lanes // XPU_THREADS_PER_WARP <= 32


def test_xpu_tiles_refuse_unaligned_blocks() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        xpu_attention_tiles(torch.bfloat16, 128, 24, True, False)


def test_xpu_options() -> None:
    """Sub-groups of 16 everywhere; the 256-GRF mode for attention only."""
    attention, reduce = xpu_options("attention"), xpu_options("reduce")
    size_key = "warp_size" if "warp_size" in attention else "threads_per_warp"
    assert attention[size_key] == reduce[size_key] == XPU_THREADS_PER_WARP
    assert attention["grf_mode"] in ("large", "256") and "grf_mode" not in reduce
    if "triton" not in sys.modules:
        assert size_key == "threads_per_warp"  # not imported: the spelling of triton-xpu <= 3.5
