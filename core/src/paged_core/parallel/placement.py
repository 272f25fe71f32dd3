"""Where an engine core's ranks run when several cores (data parallel) share one machine.

``paged serve --data-parallel-size M`` starts core ``i`` with ``PAGED_DP_RANK=i`` and
``PAGED_DP_SIZE=M`` in its environment (its tensor-parallel workers inherit them). Core ``i``'s
tensor-parallel rank ``r`` then takes accelerator ``i * N + r`` (N = tensor parallel size), and on
a CPU host every rank of every core gets ``cores / (M * ranks per core)`` threads.
"""

from __future__ import annotations

import os

import torch

DP_RANK, DP_SIZE = "PAGED_DP_RANK", "PAGED_DP_SIZE"


def dp_slot() -> tuple[int, int]:
    """This core's data-parallel index and the number of cores on the machine (``(0, 1)`` when alone)."""
    try:
        size = max(1, int(os.environ.get(DP_SIZE, "1")))
        rank = int(os.environ.get(DP_RANK, "0"))
    except ValueError:
        return 0, 1
    return (rank, size) if 0 <= rank < size else (0, 1)


def dp_environ(rank: int, size: int) -> dict[str, str]:
    """The variables that place core ``rank`` of ``size``."""
    return {DP_RANK: str(rank), DP_SIZE: str(size)}


def place(device: torch.device, tp_rank: int, tp_size: int) -> torch.device:
    """The device tensor-parallel rank ``tp_rank`` of this core runs on (CPUs: the host; accelerators: its own)."""
    if device.type == "cpu":
        return device
    local = int(os.environ.get("LOCAL_RANK", tp_rank)) if tp_size > 1 else 0
    core, _ = dp_slot()
    return torch.device(device.type, core * tp_size + local)
