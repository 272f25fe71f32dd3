"""Launcher of the routed-experts kernels (:mod:`paged_triton.moe_kernels`): a plan and grids from shapes only.

Nothing here reads a tensor's values on the host, so a captured step holds it: the ``T * k`` (token, slot) pairs
are sorted by expert on the device (stable), each expert's pairs start a new block of :data:`BLOCK_M` rows (its
last block padded), and the grid covers the most blocks any routing of these shapes can need,
``(T * k + min(E, T * k) * (BLOCK_M - 1)) // BLOCK_M``; blocks past the plan's end return at once. Each pair's
expert output is an fp32 row; each token's ``k`` rows times its weights are summed in slot order in fp32 and
rounded once to ``x.dtype`` (torch ops, the reference's own arithmetic). CPU tensors run in the Triton
interpreter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton

from paged_triton import moe_kernels
from paged_triton.launch import _launch, check_device, family_of, interpreted_family, interpreter_active

ACTIVATIONS = ("silu", "gelu_tanh")
"""The gated activations the kernels compute (every value of ``paged_core.api.Activation``)."""
BLOCK_M = 32
"""Planned rows (pairs of one expert) per program: fixed, so that a token's bits never depend on the others."""
BLOCK_N = 64
"""Output columns (intermediate for gate/up, hidden for down) per program on a device."""
BLOCK_K = 64
"""Reduction block on a device; the interpreter's own tiles take whole reductions up to 256."""
INTERPRET_BLOCK_N = 128
"""Output columns per program under the interpreter's own tiles (fewer programs: each runs in Python)."""
LANES = 128
"""Threads per program (4 warps of 32, 2 wavefronts of 64)."""


@dataclass(frozen=True)
class MoEKernels:
    """The two kernels, wrapped by ``triton.jit`` in this process's mode."""

    gate_up: Any
    down: Any


@functools.cache
def moe_kernel_set() -> MoEKernels:
    return MoEKernels(gate_up=triton.jit(moe_kernels.moe_gate_up_kernel), down=triton.jit(moe_kernels.moe_down_kernel))


def _own_interpreter_tiles() -> bool:
    return interpreter_active() and interpreted_family() is None


def _block(n: int, cap: int) -> int:
    """A power of two covering ``n`` up to ``cap`` (at least 16, ``tl.dot``'s smallest side).

    Depends on the layer's sizes only, never on the token count.
    """
    return max(16, min(cap, int(triton.next_power_of_2(max(n, 1)))))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def max_blocks(pairs: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """The most blocks of ``block_m`` rows ``pairs`` pairs over ``num_experts`` experts can fill, each nonempty
    expert's pairs padded to whole blocks: from shapes only (the grid of a captured launch)."""
    return (pairs + min(num_experts, pairs) * (block_m - 1)) // block_m


def plan(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, block_experts)`` on ``ids``' device, without a host read.

    ``rows`` ``[blocks * block_m]`` int64: the pair index (``token * k + slot``) at each planned row, the pairs
    of expert 0 first (in pair order), each expert's run starting a new block, padding ``-1``;
    ``block_experts`` ``[blocks]`` int64: each block's expert, ``num_experts`` for blocks past the last one.
    """
    flat = ids.reshape(-1).to(torch.int64)
    pairs, device = flat.numel(), flat.device
    blocks = max_blocks(pairs, num_experts, block_m)
    sorted_ids, order = torch.sort(flat, stable=True)
    # scatter_add, not bincount: bincount sizes its output from the largest id (a host read on a GPU).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts
    dest = (padded_end - padded)[sorted_ids] + torch.arange(pairs, device=device) - first[sorted_ids]
    rows = torch.full((blocks * block_m,), -1, dtype=torch.int64, device=device).scatter_(0, dest, order)
    starts = torch.arange(blocks, dtype=torch.int64, device=device) * block_m
    block_experts = torch.searchsorted(padded_end, starts, right=True)
    return rows, block_experts


def experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """``[T, H]`` in ``x.dtype``: each token's ``k`` experts' ``down(act(gate) * up)`` times its weights.

    ``x`` ``[T, H]`` (rows may be strided), ``weights`` ``[T, k]`` float, ``ids`` ``[T, k]`` integer (each in
    ``0 .. E - 1``: not checked, that would read them), dense ``gate_up`` ``[E, 2I, H]`` and ``down``
    ``[E, H, I]``. The arithmetic of ``paged_core.api.apply_experts`` with another summation order in each
    product.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: the kernels compute {', '.join(ACTIVATIONS)}")
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = gate_up.shape[0], down.shape[2]
    if tokens == 0 or top_k == 0:
        return torch.zeros_like(x, memory_format=torch.contiguous_format)
    check_device(x.device)
    ks = moe_kernel_set()
    x, gate_up, down = _unit_last(x), _unit_last(gate_up), _unit_last(down)
    rows, block_experts = plan(ids, num_experts)
    blocks = block_experts.shape[0]
    own = _own_interpreter_tiles()
    cap_n, cap_k = (INTERPRET_BLOCK_N, 256) if own else (BLOCK_N, BLOCK_K)
    options = _launch("moe", family_of(x.device), LANES)

    h = torch.empty((blocks * BLOCK_M, inter), dtype=torch.float32, device=x.device)
    block_n, block_k = _block(inter, cap_n), _block(hidden, cap_k)
    dot_fp32 = x.dtype == torch.float32 or x.dtype != gate_up.dtype or interpreter_active()
    ks.gate_up[(blocks, triton.cdiv(inter, block_n))](
        h, x, gate_up, rows, block_experts, num_experts, top_k, hidden, inter,
        x.stride(0), gate_up.stride(0), gate_up.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=dot_fp32, GELU_TANH=activation == "gelu_tanh",
        **options,
    )  # fmt: skip

    per_pair = torch.empty((tokens * top_k, hidden), dtype=torch.float32, device=x.device)
    block_n, block_k = _block(hidden, cap_n), _block(inter, cap_k)
    ks.down[(blocks, triton.cdiv(hidden, block_n))](
        per_pair, h, down, rows, block_experts, num_experts, hidden, inter, down.stride(0), down.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )  # fmt: skip

    # The reference's weighted sum, term by term: slot order, fp32, one rounding.
    per_slot = per_pair.view(tokens, top_k, hidden)
    w = weights.float()
    acc = per_slot[:, 0] * w[:, 0:1]
    for j in range(1, top_k):
        acc = acc + per_slot[:, j] * w[:, j : j + 1]
    return acc.to(x.dtype)
