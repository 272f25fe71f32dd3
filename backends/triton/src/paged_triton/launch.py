"""Launchers: wrap the Triton source once per mode and launch it with grids computed from host ints only.

Nothing here reads a tensor's values on the host (no ``.item()``/``.tolist()``): grids come from tensor
shapes and the metadata's Python ints, so a launch can be recorded in a HIP, CUDA or XPU graph. CPU tensors
run through the Triton interpreter; device tensors through compiled kernels, with the tiles and launch
options of the device's family (:func:`family_of`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from paged_core.api import UnsupportedConfigError
from paged_triton import attention_kernels, cache_kernels
from paged_triton.tile_shape import MAX_SPLITS, head_pad
from paged_triton.tiles import (
    COPY_BLOCK,
    COPY_LANES,
    FAMILIES,
    INTERPRET_TILES_ENV,
    REDUCE_LANES,
    WARP_SIZE,
    WRITE_KV_LANES,
    attention_tiles,
    dot_fp32,
    launch_options,
    num_warps,
    rdna_supported,
    split_plan,
)


@dataclass(frozen=True)
class KernelSet:
    """The four kernels, wrapped by ``triton.jit`` in this process's mode (interpreted or compiled)."""

    attention: Any
    reduce: Any
    write_kv: Any
    copy_blocks: Any


def interpreter_active() -> bool:
    """Whether this process's Triton runs kernels in the interpreter.

    Decided once, when ``triton.language`` is imported: its own helpers (``tl.zeros``, ``tl.sum``...)
    are wrapped then, so the mode cannot change afterwards.
    """
    return isinstance(tl.zeros, InterpretedFunction)


@functools.cache
def kernel_set() -> KernelSet:
    """The kernels, wrapped once per process."""
    return KernelSet(
        attention=triton.jit(attention_kernels.paged_attention_kernel),
        reduce=triton.jit(attention_kernels.paged_attention_reduce_kernel),
        write_kv=triton.jit(cache_kernels.write_kv_kernel),
        copy_blocks=triton.jit(cache_kernels.copy_blocks_kernel),
    )


def check_device(device: torch.device) -> None:
    """Refuse a device this process's Triton mode cannot serve, saying how to fix it."""
    interpreted = interpreter_active()
    if device.type == "cpu" and not interpreted:
        raise RuntimeError(
            "CPU tensors need the Triton interpreter, but triton was imported in compiled mode; set "
            "TRITON_INTERPRET=1 (or the backend's own switch, e.g. PAGED_ROCM_INTERPRET=1 or PAGED_XPU_INTERPRET=1) "
            "before anything imports triton"
        )
    if device.type != "cpu" and interpreted:
        raise RuntimeError(
            f"this process runs Triton in interpreter mode (TRITON_INTERPRET=1), which cannot launch on {device}"
        )


def interpreted_family() -> str | None:
    """The family whose tiles the interpreter uses (``None``: the interpreter's own large tiles)."""
    family = os.environ.get(INTERPRET_TILES_ENV, "").strip().lower()
    if not family:
        return None
    if family not in FAMILIES:
        raise ValueError(f"{INTERPRET_TILES_ENV}={family!r}: expected one of {', '.join(FAMILIES)}")
    return family


def _kernels_for(t: torch.Tensor) -> KernelSet:
    check_device(t.device)
    return kernel_set()


@functools.cache
def _hip_warp_size(device: torch.device) -> int:
    size = getattr(torch.cuda.get_device_properties(device), "warp_size", None)
    return int(size) if size else 64


def family_of(device: torch.device) -> str:
    """The tile family of ``device``: ``cdna``/``rdna`` (ROCm torch), ``nvidia`` (CUDA torch), ``xpu``.

    On CPU tensors (the interpreter) the family named by ``PAGED_TRITON_INTERPRET_TILES``, else ``cdna`` (its
    tiles are then replaced by the interpreter's own; see :func:`attention`).
    """
    if device.type == "cpu":
        return interpreted_family() or "cdna"
    if device.type == "xpu":
        return "xpu"
    if getattr(torch.version, "hip", None):
        return "rdna" if _hip_warp_size(device) == 32 else "cdna"
    return "nvidia"


def _launch(kernel: str, family: str, lanes: int) -> dict[str, Any]:
    """``num_warps`` plus the family's other launch options for one launch of ``kernel``."""
    return {"num_warps": num_warps(lanes, WARP_SIZE[family]), **launch_options(kernel, family)}


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dim is contiguous (views of a fused QKV are), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, kv_heads, D]`` at ``slot_mapping`` (slots of -1 are skipped on the device).

    An int8/fp8 ``kv_cache`` (``D + 2`` per vector) gets each vector quantized with its float16 scale.
    """
    tokens, kv_heads, head_size = key.shape
    if tokens == 0:
        return
    key, value = _unit_last(key), _unit_last(value)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _, block_size, _, _ = k_cache.shape
    ks = _kernels_for(kv_cache)
    ks.write_kv[(tokens, kv_heads)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        block_size,
        head_size,
        *key.stride()[:2],
        *value.stride()[:2],
        *k_cache.stride()[:3],
        HEAD_PAD=head_pad(head_size),
        **_launch("write_kv", family_of(key.device), WRITE_KV_LANES),
    )


def attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    soft_cap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """Paged attention of ``query`` ``[T, H, D]``: decode rows (split-K + reduce), then prefill rows (tiled).

    ``soft_cap`` (0.0: none) and ``window`` (keys a query sees, itself included; 0: none) as in
    ``AttentionSpec``. An int8/fp8 ``kv_cache`` is in the default quantized layout (``D + 2`` per vector).
    """
    tokens, num_heads, head_size = query.shape
    query = _unit_last(query)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    out = torch.empty((tokens, num_heads, head_size), dtype=query.dtype, device=query.device)
    ks = _kernels_for(query)
    widen = dot_fp32(query.dtype, interpreter_active())
    family = family_of(query.device)
    big_tiles = interpreter_active() and interpreted_family() is None
    features = window > 0 or soft_cap > 0
    if family == "rdna" and not rdna_supported(query.dtype, head_size):
        raise UnsupportedConfigError(
            f"fp32 attention with head size {head_size} is not supported on RDNA GPUs (its FMA dots spill); "
            f"use bf16/fp16 or head size <= 64"
        )

    def launch(
        rows: int,
        row_offset: int,
        tiles_y: int,
        splits: int,
        partition: int,
        decode: bool,
        parts: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        tiles = attention_tiles(
            query.dtype, head_size, block_size, decode, splits > 1, family, big_tiles, kv_cache.dtype, features
        )
        ks.attention[(rows, tiles_y * splits, kv_heads)](
            out,
            parts[0],
            parts[1],
            query,
            k_cache,
            v_cache,
            query_start_loc,
            seq_lens,
            block_table,
            row_offset,
            scale,
            soft_cap,
            window,
            group,
            head_size,
            block_size,
            partition,
            splits,
            *query.stride()[:2],
            block_table.stride(0),
            **tiles.constexprs(widen, window > 0, soft_cap > 0),
            **_launch("attention", family, tiles.lanes),
        )

    if num_decodes > 0:
        block_n = attention_tiles(
            query.dtype, head_size, block_size, True, False, family, big_tiles, kv_cache.dtype, features
        ).block_n
        # A windowed decode row reads at most window + block_n - 1 keys (its start aligned down to a key
        # tile): the partitions split that span, counted from the row's first key.
        span = max_seq_len if window <= 0 else min(max_seq_len, window + block_n - 1)
        splits, partition = split_plan(num_decodes, kv_heads, span, block_n)
        parts = (out, out)  # unused when not split
        if splits > 1:
            pad = head_pad(head_size)
            # Decode rows own tokens [0, num_decodes): row b's token is b.
            acc = torch.empty((num_decodes, num_heads, MAX_SPLITS, pad), dtype=torch.float32, device=query.device)
            ml = torch.empty((num_decodes, num_heads, MAX_SPLITS, 2), dtype=torch.float32, device=query.device)
            parts = (acc, ml)
        launch(num_decodes, 0, 1, splits, partition, True, parts)
        if splits > 1:
            ks.reduce[(num_decodes, num_heads)](
                out,
                parts[0],
                parts[1],
                splits,
                head_size,
                out.stride(0),
                out.stride(1),
                HEAD_PAD=parts[0].shape[-1],
                MAX_SPLITS=MAX_SPLITS,
                **_launch("reduce", family, REDUCE_LANES),
            )
    if num_prefills > 0 and max_query_len > 0:
        tiles = attention_tiles(
            query.dtype, head_size, block_size, False, False, family, big_tiles, kv_cache.dtype, features
        )
        per_tile = tiles.block_m // group
        launch(num_prefills, num_decodes, triton.cdiv(max_query_len, per_tile), 1, block_size, False, (out, out))
    return out


def copy_blocks(kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
    """Copy each (source, destination) block, keys and values, in every layer (one launch per layer)."""
    pairs = src_to_dst.to(torch.int64).contiguous()
    n = pairs.shape[0]
    if n == 0:
        return
    for cache in kv_caches:
        block_numel = cache[0, 0].numel()
        grid = (n, 2, triton.cdiv(block_numel, COPY_BLOCK))
        on_device = pairs.to(cache.device)
        _kernels_for(cache).copy_blocks[grid](
            cache,
            on_device,
            block_numel,
            cache.stride(0),
            BLOCK=COPY_BLOCK,
            **_launch("copy_blocks", family_of(cache.device), COPY_LANES),
        )
