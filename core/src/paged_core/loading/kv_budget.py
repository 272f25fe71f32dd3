"""The default KV budget: a share of free memory after profiling (explicit budgets: :mod:`paged_core.sizes`)."""

from __future__ import annotations

from paged_core.contract.device import DeviceHooks
from paged_core.errors import ConfigError

# On a CPU the KV cache shares RAM with everything else: default to a modest slice.
CPU_DEFAULT_CAP = 4 * 2**30
CPU_DEFAULT_SHARE = 0.25


def default_budget(device: DeviceHooks, fraction: float, peak_bytes: int = 0) -> int:
    """The KV budget when none is given, from the backend's device hooks.

    Devices: ``fraction`` of total device memory minus what is in use after the
    profiling step (weights and activations, ``peak_bytes``). Host RAM (CPUs): a
    quarter of available RAM, at most 4 GiB, since the host needs the rest.
    """
    memory = device.memory()
    if memory is None:
        raise ConfigError(
            f"{device.device} reports no free/total memory, so the KV cache cannot be sized from it; give the "
            f"budget explicitly (kv_cache_memory / --kv-cache-memory) or the number of blocks (num_blocks)"
        )
    free, total = memory
    if device.host:
        return int(min(CPU_DEFAULT_CAP, free * CPU_DEFAULT_SHARE))
    used = total - free
    budget = int(total * fraction) - max(used, peak_bytes)
    if budget <= 0:
        raise ConfigError(
            f"no memory left on {device.device} for the KV cache: {used / 2**30:.2f} GiB in use of "
            f"{total / 2**30:.2f} GiB with memory_fraction={fraction}; lower the model size or raise it"
        )
    return budget
