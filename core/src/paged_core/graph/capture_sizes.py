"""The capture-size policy: which token counts get a graph, and how a batch is padded to one."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from paged_core.errors import ConfigError


def capture_sizes(max_size: int, sizes: Sequence[int] | None = None) -> list[int]:
    """Sorted token counts to capture, none above ``max_size``.

    By default: 1, 2, 4, 8, then every multiple of 8 up to ``max_size``, plus
    ``max_size`` itself so the largest batch the runner allows is covered.
    Small sizes are dense because decode batches are small and padding a
    batch of 3 to 8 would waste most of the step. An explicit ``sizes`` list
    replaces the default; it is deduplicated and sorted.
    """
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0:
        raise ConfigError(f"max_size must be a positive int, got {max_size!r}")
    if sizes is not None:
        bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s <= 0]
        if bad:
            raise ConfigError(f"capture sizes must be positive ints, got {bad}")
        if not sizes:
            raise ConfigError("an explicit capture-size list must not be empty")
        too_big = [s for s in sizes if s > max_size]
        if too_big:
            raise ConfigError(f"capture sizes {sorted(set(too_big))} exceed max_size={max_size}")
        return sorted(set(sizes))
    chosen = {s for s in (1, 2, 4) if s <= max_size}
    chosen.update(range(8, max_size + 1, 8))
    chosen.add(max_size)
    return sorted(chosen)


def padded_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size in sorted ``sizes`` that is ``>= n``, or ``None`` (run eagerly)."""
    if n <= 0:
        raise ConfigError(f"cannot pad a batch of {n} tokens")
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None
