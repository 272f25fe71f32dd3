"""Which tensor-parallel sizes a model allows: every rank holds whole heads, whole KV heads, an equal MLP share."""

from __future__ import annotations

import math
from typing import Any

from paged_core.contract.capabilities import AttentionSpec
from paged_core.errors import UnsupportedConfigError


def working_sizes(specs: list[AttentionSpec], intermediate_size: int | None) -> list[int]:
    """The tensor-parallel sizes that divide every layer's heads, KV heads and (if known) the MLP width."""
    g = 0
    for s in specs:
        g = math.gcd(g, math.gcd(s.num_heads, s.num_kv_heads))
    if intermediate_size:
        g = math.gcd(g, intermediate_size)
    return [n for n in range(1, g + 1) if g % n == 0] or [1]


def check_tp_size(tp: int, specs: list[AttentionSpec], model_config: Any) -> None:
    """Refuse a ``tp`` that does not split the model evenly, naming the counts and the sizes that work.

    Runs on the weightless (meta-device) specs, so a bad size costs no weight loading.
    """
    if tp == 1:
        return
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    inter = getattr(text, "intermediate_size", None)
    inter = int(inter) if isinstance(inter, int) else None
    sizes = working_sizes(specs, inter)
    if tp in sizes:
        return
    heads = sorted({s.num_heads for s in specs})
    kv = sorted({s.num_kv_heads for s in specs})
    counts = f"{'/'.join(map(str, heads))} attention heads and {'/'.join(map(str, kv))} KV heads"
    if inter:
        counts += f" (MLP width {inter})"
    raise UnsupportedConfigError(
        f"tensor_parallel_size={tp} does not divide the model's {counts}; sizes that work: "
        + ", ".join(map(str, sizes))
    )


def local_specs(specs: list[AttentionSpec], tp: int) -> list[AttentionSpec]:
    """Each layer's spec as one rank sees it: ``1/tp`` of the heads and of the KV heads."""
    if tp == 1:
        return specs
    from dataclasses import replace

    return [replace(s, num_heads=s.num_heads // tp, num_kv_heads=s.num_kv_heads // tp) for s in specs]
