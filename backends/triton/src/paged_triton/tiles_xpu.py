"""Intel GPU (``xpu`` family) tiles and launch options, chosen so that no kernel spills on pvc or dg2.

Measured with ``python -m paged_backend_xpu.aot`` (triton-xpu 3.3 to SPIR-V, IGC's ``ocloc`` to pvc = Data
Center GPU Max 1550 and dg2 = Arc A770 native code), which compiles exactly what :func:`xpu_attention_tiles`
and :func:`xpu_options` choose here. What the measurements showed:

* Sub-groups of 16 (:data:`XPU_THREADS_PER_WARP`): the only size at which Triton lowers ``tl.dot`` to DPAS
  (pvc). dg2 reports a minimum sub-group size of 8, so Triton runs its dots on FMAs there, whatever the tiles.
* 256 registers per hardware thread (``grf_mode`` large, ``xpu_options``) for attention: at 128 every tile
  spills on both devices. The large mode allows at most 32 sub-groups per work-group: 512 lanes.
* 512 lanes (32 sub-groups) for attention: more sub-groups spread the accumulator, the key/value tiles and
  the dot operands over more hardware threads; 128 and 256 lanes spilled where 512 did not.
* ``BLOCK_N = 16`` (the smallest ``tl.dot`` K; 32-key tiles spilled on pvc) and ``D_CHUNK = 32``: q.k dots over
  32-wide head-dim chunks (full-width q.k operands spilled at head 128 on both devices; 16-wide chunks were no
  better and cost more loop trips).
* ``BLOCK_M``: 16 query rows (decode: one token times up to 16 GQA heads; tl.dot on Intel needs M >= 8, the
  kernels' GQA limit needs 16); prefill gets 32 rows up to head 64 (more reuse of each key/value tile), 16
  above (32 rows spilled at head 128 on dg2 in every dtype, and for bf16 on pvc).
* Head 256 is not declared on Intel (paged-backend-xpu declares 64-128): with bf16/fp16 DPAS dots it spills
  246-304 registers on pvc at every tile shape tried; fp32 dots on FMAs clear pvc, but dg2 (half pvc's register
  file per thread) still spills 2-24 registers in decode and decode-split at every shape (128-512 lanes, 16-256
  chunks, 16/32 keys). Chunking the p.v dot over the head dimension is the kernel work that would bring it back.

Reduce, write_kv and copy_blocks keep the default register mode (128 GRF, twice the hardware threads per EU):
they do not spill in it.
"""

from __future__ import annotations

import sys

import torch

from paged_triton.tile_shape import DECODE_BLOCK_M, AttentionTiles, head_pad

XPU_THREADS_PER_WARP = 16
"""Sub-group size the kernels are launched with on Intel GPUs (DPAS needs 16)."""
XPU_ATTENTION_LANES = 512
"""Threads per attention program: 32 sub-groups of 16, the most a work-group has in the 256-GRF mode."""
XPU_BLOCK_N = 16
"""Keys per attention tile (divides every block size the backend accepts, a multiple of 16)."""
XPU_D_CHUNK = 32
"""Head-dim width of one q.k dot."""
XPU_PREFILL_WIDE_HEAD = 64
"""Largest head tile whose prefill tiles get 32 query rows (wider ones spill at 32 rows on dg2, bf16 on pvc)."""


def xpu_attention_tiles(
    dtype: torch.dtype,
    head_size: int,
    block_size: int,
    decode: bool,
    split: bool,
    kv_dtype: torch.dtype | None = None,
) -> AttentionTiles:
    """Tiles for an Intel GPU (see the module's notes): 16-key tiles, 32-wide q.k chunks, 512 lanes.

    ``kv_dtype`` (the cache's dtype) does not change the choice: a cache wider than the queries is converted
    to the query dtype right after loading, and the aot report shows those variants spill-free too.
    """
    del kv_dtype
    if block_size % XPU_BLOCK_N:
        raise ValueError(f"block size {block_size} is not a multiple of {XPU_BLOCK_N}")
    pad = head_pad(head_size)
    block_m = 2 * DECODE_BLOCK_M if not decode and pad <= XPU_PREFILL_WIDE_HEAD else DECODE_BLOCK_M
    return AttentionTiles(pad, block_m, XPU_BLOCK_N, split and decode, min(pad, XPU_D_CHUNK), XPU_ATTENTION_LANES)


_SPELLING: list[tuple[str, str]] = []


def _option_spelling() -> tuple[str, str]:
    """(sub-group size option, 256-GRF value) in the spelling of this process's Intel Triton backend.

    triton-xpu / pytorch-triton-xpu up to 3.5 take ``threads_per_warp`` and ``grf_mode="large"``; from 3.6 on
    they take ``warp_size`` and ``grf_mode="256"`` (and silently drop option names they do not know). Without
    Intel's backend (PyPI's ``triton``) the older spelling is returned: nothing compiles for XPU there. Triton is
    only inspected once something has imported it (importing it here would fix its interpreter mode early).
    """
    if _SPELLING:
        return _SPELLING[0]
    if "triton" not in sys.modules:
        return "threads_per_warp", "large"
    try:
        from triton.backends.intel.compiler import XPUOptions  # type: ignore[import-not-found,unused-ignore]
    except Exception:  # no Intel backend, or one failing to load
        fields: dict[str, object] = {}
    else:
        fields = getattr(XPUOptions, "__dataclass_fields__", {})
    _SPELLING.append(("warp_size", "256") if "warp_size" in fields else ("threads_per_warp", "large"))
    return _SPELLING[0]


def xpu_options(kernel: str) -> dict[str, object]:
    """Extra launch (compile) options on Intel GPUs for ``kernel``: the sub-group size, and 256 GRF for attention."""
    size_name, large = _option_spelling()
    options: dict[str, object] = {size_name: XPU_THREADS_PER_WARP}
    if kernel == "attention":
        options["grf_mode"] = large
    return options
