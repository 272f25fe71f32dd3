"""Byte sizes written as text: ``"4GiB"``, ``"512MB"``, ``"1.5G"`` or a plain byte count."""

from __future__ import annotations

import re

from paged_core.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, field: str = "kv_cache_memory") -> int:
    """Bytes from an int or a string such as ``"4GiB"``, ``"512MB"``, ``"1.5G"``; errors name ``field``."""
    if isinstance(value, bool):
        raise ConfigError(f"{field} must be a size such as '4GiB' or a byte count, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"{field} must be positive, got {value}")
        return value
    m = _SIZE.match(str(value))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError(f"{field} must be a size such as '4GiB', '512MiB', '2GB' or a byte count; got {value!r}")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"{field} must be positive, got {value!r}")
    return size
