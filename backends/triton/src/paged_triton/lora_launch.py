"""Launchers of the multi-LoRA kernels (:mod:`paged_triton.lora_kernels`): grids from tensor shapes only.

Nothing here reads a tensor's values on the host: up to :data:`TOKEN_KERNEL_MAX` tokens each token is one
program (decode: no sort), above that the token indices are sorted by slot on the device and each program owns
a block of them (:mod:`paged_triton.lora_kernels`). CPU tensors run in the Triton interpreter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton

from paged_triton import lora_kernels
from paged_triton.launch import _launch, check_device, family_of, interpreted_family, interpreter_active

TOKEN_KERNEL_MAX = 16
"""Token counts up to which every token is its own program (below ``tl.dot``'s 16 rows)."""
BLOCK_T = 32
"""Sorted tokens per program of the segmented kernels."""
BLOCK_OUT = 64
"""Outputs (ranks of shrink, features of expand) per program."""
BLOCK_REDUCE = 64
"""Reduction block (``K`` of shrink, ranks of expand) on a device; the interpreter's own tiles take up to 256."""
LANES = 128
"""Threads per program (4 warps of 32, 2 wavefronts of 64)."""
EXPAND_TILES: dict[torch.dtype, tuple[int, int]] = {torch.float32: (64, 128)}
"""``(BLOCK_T, BLOCK_N)`` of the sorted ``lora_expand`` per dtype of ``y`` (others: ``BLOCK_T``, ``BLOCK_OUT``).
Measured on an H200 (benchmarks/lora_triton.py, 8B q/k/v, 8,192 tokens): fp32 399 us at 64 x 128 against 683 at
32 x 64; bf16 with fp32 operands 1,104 us at 32 x 64 and 6.5-9 ms at 64-128 rows (spilled)."""
EXPAND_HALF_DOT = False
"""Round the shrunk rows to the adapters' 16-bit dtype for a tensor-core dot in the sorted ``lora_expand`` (see
:mod:`paged_triton.lora_kernels`). Off: the contract rounds once. Measured on an H200 (8B q/k/v, bf16, 8,192
tokens): 178-233 us against 1,104 us with fp32 operands; within the bf16 tolerance of the reference there."""
INTERPRET_PROCESSORS = 8
"""Multiprocessors the interpreter pretends to have with a family's tiles (PAGED_TRITON_INTERPRET_TILES), so that
the checks exercise the split-K path; with its own tiles it never splits."""


@dataclass(frozen=True)
class LoraKernels:
    """The four kernels, wrapped by ``triton.jit`` in this process's mode."""

    shrink_segmented: Any
    expand_segmented: Any
    shrink_token: Any
    expand_token: Any


@functools.cache
def lora_kernel_set() -> LoraKernels:
    return LoraKernels(
        shrink_segmented=triton.jit(lora_kernels.lora_shrink_segmented_kernel),
        expand_segmented=triton.jit(lora_kernels.lora_expand_segmented_kernel),
        shrink_token=triton.jit(lora_kernels.lora_shrink_token_kernel),
        expand_token=triton.jit(lora_kernels.lora_expand_token_kernel),
    )


def _kernels(t: torch.Tensor) -> LoraKernels:
    check_device(t.device)
    return lora_kernel_set()


def _block(n: int, cap: int) -> int:
    """A power of two covering ``n`` up to ``cap`` (at least 16, ``tl.dot``'s smallest side)."""
    return max(16, min(cap, int(triton.next_power_of_2(max(n, 1)))))


def _reduce_cap() -> int:
    # The interpreter runs every loop trip in Python: whole reductions in one block where they fit, unless a
    # family's device tiles were asked for (PAGED_TRITON_INTERPRET_TILES, as for attention).
    return 256 if interpreter_active() and interpreted_family() is None else BLOCK_REDUCE


def _options(t: torch.Tensor) -> dict[str, Any]:
    return _launch("lora", family_of(t.device), LANES)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


@functools.cache
def _processors(device: torch.device) -> int:
    """Multiprocessors (CUDA/HIP), Xe cores (XPU) of ``device``; the interpreter's :data:`INTERPRET_PROCESSORS`."""
    if device.type == "cpu":
        return 0
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        return int(getattr(props, "gpu_subslice_count", 0) or getattr(props, "max_compute_units", 64) // 8 or 8)
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _k_split(programs: int, k: int, block_k: int, device: torch.device) -> tuple[int, int]:
    """``(k_split, splits)``: the reduction cut so that about two programs per multiprocessor run (never below one
    ``BLOCK_K`` per program)."""
    units = INTERPRET_PROCESSORS if interpreter_active() and interpreted_family() is not None else _processors(device)
    blocks = triton.cdiv(k, block_k)
    splits = max(1, min(blocks, triton.cdiv(2 * units, programs))) if units else 1
    k_split = triton.cdiv(blocks, splits) * block_k
    return k_split, triton.cdiv(k, k_split)


def _sorted(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, sorted slots)``: token indices in ascending slot order (stable), both int64, on the device."""
    values, order = torch.sort(slots, stable=True)
    return order, values


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[T, R]`` fp32, row ``t`` = ``x[t] @ a[slots[t]].T``, zero where ``slots[t] < 0``."""
    tokens, k = x.shape
    rank = a.shape[1]
    if tokens == 0 or rank == 0:
        return torch.zeros((tokens, rank), dtype=torch.float32, device=x.device)
    x, a, slots = _unit_last(x), _unit_last(a), slots.to(torch.int64).contiguous()
    ks = _kernels(x)
    block_k, block_r = _block(k, _reduce_cap()), _block(rank, BLOCK_OUT)
    per_token = tokens <= TOKEN_KERNEL_MAX
    grid = (tokens if per_token else triton.cdiv(tokens, BLOCK_T), triton.cdiv(rank, block_r))
    k_split, splits = _k_split(grid[0] * grid[1], k, block_k, x.device)
    # Split programs add into zeros; a single one stores its rows (tokens without an adapter get its zeros).
    out = (torch.zeros if splits > 1 else torch.empty)((tokens, rank), dtype=torch.float32, device=x.device)
    if per_token:
        ks.shrink_token[(*grid, splits)](
            out, x, a, slots, rank, k, x.stride(0), a.stride(0), a.stride(1), k_split,
            BLOCK_R=block_r, BLOCK_K=block_k, ATOMIC=splits > 1, **_options(x),
        )  # fmt: skip
        return out
    order, sorted_slots = _sorted(slots)
    dot_fp32 = x.dtype == torch.float32 or x.dtype != a.dtype or interpreter_active()
    ks.shrink_segmented[(*grid, splits)](
        out, x, a, order, sorted_slots, tokens, rank, k, x.stride(0), a.stride(0), a.stride(1), k_split,
        BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_K=block_k, DOT_FP32=dot_fp32, ATOMIC=splits > 1, **_options(x),
    )  # fmt: skip
    return out


def lora_expand(y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """In place: ``y[t] += shrunk[t] @ b[slots[t]].T`` in fp32, rounded once; rows with ``slots[t] < 0`` untouched."""
    tokens, n = y.shape
    rank = b.shape[2]
    if tokens == 0 or n == 0:
        return
    if n > 1 and y.stride(1) != 1:  # the kernels write rows with unit stride: through a copy
        tmp = y.contiguous()
        lora_expand(tmp, shrunk, b, slots)
        y.copy_(tmp)
        return
    shrunk = _unit_last(shrunk.to(torch.float32))
    b, slots = _unit_last(b), slots.to(torch.int64).contiguous()
    ks = _kernels(y)
    block_r = _block(rank, _reduce_cap())
    block_n = _block(n, BLOCK_OUT)
    if tokens <= TOKEN_KERNEL_MAX:
        ks.expand_token[(tokens, triton.cdiv(n, block_n))](
            y, shrunk, b, slots, n, rank, y.stride(0), shrunk.stride(0), b.stride(0), b.stride(1),
            BLOCK_N=block_n, BLOCK_R=block_r, **_options(y),
        )  # fmt: skip
        return
    order, sorted_slots = _sorted(slots)
    half_dot = EXPAND_HALF_DOT and b.dtype != torch.float32 and not interpreter_active()
    block_t, block_n = EXPAND_TILES.get(y.dtype, (BLOCK_T, block_n))
    ks.expand_segmented[(triton.cdiv(tokens, block_t), triton.cdiv(n, block_n))](
        y, shrunk, b, order, sorted_slots, tokens, n, rank, y.stride(0), shrunk.stride(0), b.stride(0), b.stride(1),
        BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_R=block_r, HALF_DOT=half_dot, **_options(y),
    )  # fmt: skip
