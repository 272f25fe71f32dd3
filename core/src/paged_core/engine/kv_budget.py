"""The default KV budget: a share of free memory after profiling (explicit budgets: :mod:`paged_core.sizes`)."""

from __future__ import annotations

import psutil
import torch

from paged_core.errors import ConfigError

# On a CPU the KV cache shares RAM with everything else: default to a modest slice.
CPU_DEFAULT_CAP = 4 * 2**30
CPU_DEFAULT_SHARE = 0.25


def default_budget(device: torch.device, fraction: float, peak_bytes: int = 0) -> int:
    """The KV budget when none is given.

    GPUs: ``fraction`` of total device memory minus what is in use after the
    profiling step (weights and activations, ``peak_bytes``). CPUs: a quarter
    of available RAM, at most 4 GiB, since the host needs the rest.
    """
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * fraction) - max(used, peak_bytes)
        if budget <= 0:
            raise ConfigError(
                f"no device memory left for the KV cache: {used / 2**30:.2f} GiB in use of "
                f"{total / 2**30:.2f} GiB with memory_fraction={fraction}; lower the model size or raise it"
            )
        return budget
    available = psutil.virtual_memory().available
    return int(min(CPU_DEFAULT_CAP, available * CPU_DEFAULT_SHARE))
