"""Tile sizes, split plans and launch options: the one place launch parameters are chosen, per device family.

The launcher (:mod:`paged_triton.launch`) and every ahead-of-time check (the backends' ``aot`` modules, through
:mod:`paged_triton.specializations`) call these functions, so the specializations compiled for a resource
report are exactly the ones a backend launches. Families: ``cdna`` (AMD wave64), ``rdna`` (AMD wave32, gfx11),
``nvidia``, ``xpu`` (Intel, :mod:`paged_triton.tiles_xpu`).
"""

from __future__ import annotations

import torch

from paged_triton.tile_shape import ATTENTION_LANES, DECODE_BLOCK_M, MAX_SPLITS, AttentionTiles, head_pad
from paged_triton.tiles_xpu import XPU_THREADS_PER_WARP, xpu_attention_tiles, xpu_options

FAMILIES = ("cdna", "rdna", "nvidia", "xpu")
"""Device families with their own tiles."""
INTERPRET_TILES_ENV = "PAGED_TRITON_INTERPRET_TILES"
"""Set to a family to make the Triton interpreter launch that family's device tiles instead of its own large ones
(slower; the kernel tests do, to check every family's shapes compute the same)."""
WARP_SIZE = {"cdna": 64, "rdna": 32, "nvidia": 32, "xpu": XPU_THREADS_PER_WARP}
"""Threads per warp (wave, sub-group) each family's kernels are launched with."""
MIN_PARTITION = 256
"""Fewest keys per partition: shorter contexts are not split (the reduction would cost more than it saves)."""
TARGET_PROGRAMS = 2048
"""Decode programs worth launching: enough to fill an MI300X (304 CUs) or an H200 (132 SMs) several times."""
KV_TILE_BYTES = 4 * 1024
"""Budget of one decode key (or value) tile in the compute dtype: larger tiles spill (measured with aot)."""
RDNA_D_CHUNK = 64
"""Head-dim chunk of q.k dots on RDNA (gfx11)."""
RDNA_FP32_D_CHUNK = 32
RDNA_FP32_MAX_HEAD = 64
"""Largest head size of fp32 attention on RDNA: its FMA dots spill beyond (aot report); refused there."""
NVIDIA_ATTENTION_MAXNREG = 255
"""Register cap for attention on NVIDIA: left alone, ptxas caps 256-thread programs at 128 and spills."""
REDUCE_LANES = 128
WRITE_KV_LANES = 64
COPY_LANES = 256
MAX_GROUP = DECODE_BLOCK_M
"""Largest GQA ratio (query heads per KV head) the kernels accept."""
COPY_BLOCK = 1024
"""Elements moved per program by copy_blocks."""


def rdna_supported(dtype: torch.dtype, head_size: int) -> bool:
    """Whether RDNA (gfx11) runs attention in ``dtype`` at ``head_size`` without spilling."""
    return dtype != torch.float32 or head_pad(head_size) <= RDNA_FP32_MAX_HEAD


def dot_fp32(dtype: torch.dtype, interpreted: bool) -> bool:
    """Whether attention dots run on fp32 operands (see :mod:`paged_triton.attention_kernels`)."""
    return dtype == torch.float32 or (interpreted and dtype == torch.bfloat16)


def attention_tiles(
    dtype: torch.dtype,
    head_size: int,
    block_size: int,
    decode: bool,
    split: bool,
    family: str = "cdna",
    interpreter: bool = False,
    kv_dtype: torch.dtype | None = None,
    features: bool = False,
) -> AttentionTiles:
    """Tiles for queries of ``dtype``: BLOCK_N divides the block size and keeps a KV tile in budget.

    ``family``: the device family (``rdna``: AMD wave32, whose WMMA operands cost a whole row per lane;
    ``xpu``: Intel's own tiles).
    ``kv_dtype``: the cache's dtype (a cache wider than the queries is converted after loading).
    ``features``: the variant with a sliding window or a soft cap compiled in (more live values).
    ``interpreter``: the Triton interpreter, where registers cost nothing and every loop trip costs
    Python time, so tiles are as large as the block allows (same code, fewer trips).
    """
    pad = head_pad(head_size)
    if interpreter:
        block_n = max(b for b in (16, 32, 64) if block_size % b == 0)
        return AttentionTiles(pad, DECODE_BLOCK_M if decode else 64, block_n, split and decode, pad)
    if family == "xpu":
        return xpu_attention_tiles(dtype, head_size, block_size, decode, split, kv_dtype)
    rdna = family == "rdna"
    elem = torch.empty((), dtype=dtype).element_size()
    # A quantized (8-bit) cache on RDNA: converting its tiles (fp8 in software on gfx11) spilled (aot report).
    quantized_rdna = rdna and kv_dtype is not None and torch.empty((), dtype=kv_dtype).element_size() == 1
    # Prefill tiles already have BLOCK_M rows; a wider key tile there spills SGPRs on CDNA (aot report).
    block_n = 16 if not decode or quantized_rdna else 64
    # A window or soft cap costs scalar registers: decode keeps half the key tile there (aot report).
    budget = KV_TILE_BYTES // 2 if features else KV_TILE_BYTES
    while block_n > 16 and (block_size % block_n or block_n * pad * elem > budget):
        block_n //= 2
    if block_size % block_n:
        raise ValueError(f"block size {block_size} is not a multiple of 16")
    block_m = DECODE_BLOCK_M if decode else (64 if pad * elem <= 128 else 32)
    # fp32 dots have no WMMA on RDNA: they run on FMAs, whose operands are narrower still.
    # (And a quantized cache's converted chunks are narrower too, as fp32's: wider ones spilled, aot report.)
    chunk = min(pad, RDNA_FP32_D_CHUNK if dot_fp32(dtype, False) or quantized_rdna else RDNA_D_CHUNK)
    # Twice the threads where the aot report showed spills at 256: fp32 at head 256, and a cache wider
    # than the queries (except at head 256 on CDNA, where 512 threads spill SGPRs instead).
    wide_cache = kv_dtype is not None and torch.empty((), dtype=kv_dtype).element_size() > elem
    wide = (elem == 4 and pad == 256) or (wide_cache and (pad < 256 or rdna)) or quantized_rdna
    if wide_cache and features and not decode and not rdna:
        block_m = DECODE_BLOCK_M  # prefill with a window or soft cap over a wider cache spilled SGPRs at 32 rows
    lanes = 2 * ATTENTION_LANES if wide else ATTENTION_LANES
    return AttentionTiles(pad, block_m, block_n, split and decode, chunk if rdna else pad, lanes)


def split_plan(num_decodes: int, num_kv_heads: int, max_seq_len: int, block_n: int) -> tuple[int, int]:
    """``(num_splits, partition)`` for decode rows whose longest context is ``max_seq_len`` keys.

    Uses only host ints (under graph capture ``max_seq_len`` is the captured bound, so the plan is
    frozen with the graph and still covers every replayed batch). ``partition`` is a multiple of
    ``block_n``; partitions past a row's length do no work and weigh nothing in the reduction.
    """
    if max_seq_len <= MIN_PARTITION:
        return 1, max(1, -(-max_seq_len // block_n)) * block_n
    wanted = max(1, -(-TARGET_PROGRAMS // max(1, num_decodes * num_kv_heads)))
    splits = min(MAX_SPLITS, -(-max_seq_len // MIN_PARTITION), wanted)
    partition = -(-max_seq_len // splits)
    partition = -(-partition // block_n) * block_n
    return -(-max_seq_len // partition), partition


def num_warps(lanes: int, warp_size: int) -> int:
    """Warps (waves) giving ``lanes`` threads on a device whose warp/wave has ``warp_size`` threads."""
    return max(1, lanes // warp_size)


def launch_options(kernel: str, family: str) -> dict[str, object]:
    """Launch options beyond ``num_warps`` for ``kernel`` (``attention``, ``reduce``, ``write_kv``, ``copy_blocks``)."""
    if family == "xpu":
        return xpu_options(kernel)
    if family == "nvidia" and kernel == "attention":
        return {"maxnreg": NVIDIA_ATTENTION_MAXNREG}
    return {}
