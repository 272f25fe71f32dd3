"""How many KV blocks to allocate: an explicit byte budget, or a share of free memory after profiling."""

from __future__ import annotations

import re

import psutil
import torch

from paged_core.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
# On a CPU the KV cache shares RAM with everything else: default to a modest slice.
CPU_DEFAULT_CAP = 4 * 2**30
CPU_DEFAULT_SHARE = 0.25


def parse_size(value: int | str, field: str = "kv_cache_memory") -> int:
    """Bytes from an int or a string such as ``"4GiB"``, ``"512MB"``, ``"1.5G"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{field} must be a size such as '4GiB' or a byte count, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"{field} must be positive, got {value}")
        return value
    m = _SIZE.match(str(value))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError(
            f"{field} must be a size such as '4GiB', '512MiB', '2GB' or a byte count; got {value!r}"
        )
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"{field} must be positive, got {value!r}")
    return size


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
