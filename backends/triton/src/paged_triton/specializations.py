"""Every kernel specialization the backend can launch, derived from its declared capabilities.

A specialization is a kernel plus its compile-time constants, pointer types and launch options for one
device family; the launcher (:mod:`paged_triton.launch`) picks them through the same functions in
:mod:`paged_triton.tiles`, so this list is complete by construction. Runtime integers are
compiled as generic ``i32`` (the JIT may additionally specialise on divisibility; resource use is the same
kernel body).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from paged_core.api import BackendCapabilities
from paged_triton.tile_shape import MAX_SPLITS, head_pad
from paged_triton.tiles import (
    COPY_BLOCK,
    COPY_LANES,
    REDUCE_LANES,
    WRITE_KV_LANES,
    attention_tiles,
    dot_fp32,
    launch_options,
    rdna_supported,
)

POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int8: "*i8",
    torch.float8_e4m3fn: "*fp8e4nv",
    torch.float8_e5m2: "*fp8e5",
}
"""Triton pointer type of a tensor of each dtype (the 8-bit ones: quantized KV caches)."""


@dataclass(frozen=True)
class Specialization:
    """One compiled variant: kernel name, a readable label, constexprs, pointer types and threads."""

    kernel: str
    label: str
    constexprs: tuple[tuple[str, int | bool], ...]
    pointers: tuple[tuple[str, str], ...]
    lanes: int
    """Threads per program; warps = lanes // the target's warp size, as the launcher computes it."""
    float_args: tuple[str, ...] = field(default=())
    options: tuple[tuple[str, object], ...] = field(default=())
    """Launch options beyond ``num_warps`` (NVIDIA's ``maxnreg``, Intel's GRF mode), as the launcher passes them."""

    def signature(self, arg_names: list[str]) -> dict[str, str]:
        """Triton signature for ``arg_names``: pointers typed, constexprs marked, other ints ``i32``."""
        pointers, consts = dict(self.pointers), dict(self.constexprs)
        sig = {}
        for name in arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name in pointers:
                sig[name] = pointers[name]
            elif name in self.float_args:
                sig[name] = "fp32"
            else:
                sig[name] = "i32"
        return sig


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _options(kernel: str, family: str) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(launch_options(kernel, family).items()))


def features(caps: BackendCapabilities) -> list[tuple[bool, bool]]:
    """The ``(window, soft_cap)`` variants compiled for ``caps``: each declared feature on and off."""
    windows = (False, True) if caps.sliding_window else (False,)
    soft_caps = (False, True) if caps.logits_soft_cap else (False,)
    return [(w, c) for w in windows for c in soft_caps]


def attention_specializations(caps: BackendCapabilities, family: str) -> Iterator[Specialization]:
    """Attention (decode direct, decode split, prefill) and reduction variants for every declared combination.

    ``family`` selects the tiles launched on that kind of device (see :mod:`paged_triton.tiles`).
    """
    rdna = family == "rdna"
    heads = sorted(caps.head_sizes or ())
    seen: set[tuple[object, ...]] = set()
    for (window, soft_cap), q in ((f, q) for f in features(caps) for q in sorted(caps.dtypes, key=_name)):
        for kv in sorted(caps.effective_kv_cache_dtypes, key=_name):
            for head in heads:
                if rdna and not rdna_supported(q, head):
                    continue  # refused at launch on RDNA (see tiles.rdna_supported)
                for block in caps.block_sizes:
                    for decode, split in ((True, False), (True, True), (False, False)):
                        tiles = attention_tiles(
                            q, head, block, decode, split, family, kv_dtype=kv, features=window or soft_cap
                        )
                        key = ("attention", q, kv, tiles, window, soft_cap)
                        if key in seen:
                            continue
                        seen.add(key)
                        mode = "decode-split" if split else "decode" if decode else "prefill"
                        qt, kt = POINTER_TYPES[q], POINTER_TYPES[kv]
                        yield Specialization(
                            "attention",
                            f"attention {mode} q={_name(q)} kv={_name(kv)} D{tiles.head_pad} "
                            f"M{tiles.block_m} N{tiles.block_n}"
                            + (f" C{tiles.d_chunk}" if tiles.d_chunk != tiles.head_pad else "")
                            + (" window" if window else "")
                            + (" softcap" if soft_cap else ""),
                            tuple(tiles.constexprs(dot_fp32(q, interpreted=False), window, soft_cap).items()),
                            (
                                ("out_ptr", qt),
                                ("part_acc_ptr", "*fp32"),
                                ("part_ml_ptr", "*fp32"),
                                ("q_ptr", qt),
                                ("k_cache_ptr", kt),
                                ("v_cache_ptr", kt),
                                ("query_start_loc_ptr", "*i32"),
                                ("seq_lens_ptr", "*i32"),
                                ("block_table_ptr", "*i32"),
                            ),
                            tiles.lanes,
                            ("scale", "soft_cap"),
                            _options("attention", family),
                        )
    for q in sorted(caps.dtypes, key=_name):
        for pad in sorted({head_pad(h) for h in heads}):
            yield Specialization(
                "reduce",
                f"reduce out={_name(q)} D{pad} S{MAX_SPLITS}",
                (("HEAD_PAD", pad), ("MAX_SPLITS", MAX_SPLITS)),
                (("out_ptr", POINTER_TYPES[q]), ("part_acc_ptr", "*fp32"), ("part_ml_ptr", "*fp32")),
                REDUCE_LANES,
                options=_options("reduce", family),
            )


def cache_specializations(caps: BackendCapabilities, family: str) -> Iterator[Specialization]:
    """write_kv for every (input dtype, cache dtype, head tile) and copy_blocks for every cache dtype."""
    heads = sorted(caps.head_sizes or ())
    pads = sorted({head_pad(h) for h in heads})
    for q in sorted(caps.dtypes, key=_name):
        for kv in sorted(caps.effective_kv_cache_dtypes, key=_name):
            for pad in pads:
                qt, kt = POINTER_TYPES[q], POINTER_TYPES[kv]
                yield Specialization(
                    "write_kv",
                    f"write_kv in={_name(q)} cache={_name(kv)} D{pad}",
                    (("HEAD_PAD", pad),),
                    (
                        ("key_ptr", qt),
                        ("value_ptr", qt),
                        ("k_cache_ptr", kt),
                        ("v_cache_ptr", kt),
                        ("slot_mapping_ptr", "*i64"),
                    ),
                    WRITE_KV_LANES,
                    options=_options("write_kv", family),
                )
    for kv in sorted(caps.effective_kv_cache_dtypes, key=_name):
        yield Specialization(
            "copy_blocks",
            f"copy_blocks cache={_name(kv)}",
            (("BLOCK", COPY_BLOCK),),
            (("cache_ptr", POINTER_TYPES[kv]), ("pairs_ptr", "*i64")),
            COPY_LANES,
            options=_options("copy_blocks", family),
        )


def all_specializations(caps: BackendCapabilities, family: str) -> list[Specialization]:
    """Every specialization launched on ``family`` devices, attention kernels first."""
    return [*attention_specializations(caps, family), *cache_specializations(caps, family)]
