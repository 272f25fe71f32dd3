"""KV-cache groups: layers grouped by attention kind, each group with its own block table out of one pool.

A model whose layers all attend alike (full attention, or one sliding window everywhere) has one group
holding every layer: today's single block table. A hybrid model (Gemma 2 and 3, gpt-oss: some layers
slide over a window, others see everything) has one group per kind and, when one kind has more layers
than another, several groups of that kind, so that every group has the same number of layers ``g`` (the
greatest common divisor of the kinds' layer counts). The cache is then ``g`` tensors of ``num_blocks``
blocks: tensor ``j`` holds layer ``j`` of every group, and a block id belongs to one group at a time. So a
block costs the same bytes whichever group holds it, and a sliding group hands blocks back to the one
pool as its window moves on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from paged_core.contract.capabilities import AttentionSpec
from paged_core.errors import UnsupportedConfigError


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers sharing one block table: their indices (model order) and their window (``None``: full)."""

    layers: tuple[int, ...]
    sliding_window: int | None = None

    def window_blocks(self, block_size: int, chunk: int) -> int | None:
        """At most how many blocks one request holds in this group while steps of up to ``chunk`` new tokens
        run (``None``: unbounded, a full-attention group keeps every block)."""
        if self.sliding_window is None:
            return None
        # The window behind the chunk and the chunk: W - 1 + chunk consecutive positions, which touch at most
        # ceil((span - 1) / block_size) + 1 blocks.
        return -(-(self.sliding_window - 2 + chunk) // block_size) + 1

    def first_needed_block(self, num_computed: int, block_size: int) -> int:
        """Index of the first block a query at position ``num_computed`` or later can still see."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed - self.sliding_window + 1) // block_size


@dataclass(frozen=True, slots=True)
class KVCacheGroups:
    """The model's groups; ``layer_group[i]`` and ``layer_tensor[i]`` place layer ``i``."""

    groups: tuple[KVCacheGroup, ...]
    layer_group: tuple[int, ...]
    layer_tensor: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_tensors(self) -> int:
        """Cache tensors (layers per group): one block id costs this many layers' KV."""
        return len(self.groups[0].layers)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1

    @property
    def has_sliding(self) -> bool:
        return any(g.sliding_window is not None for g in self.groups)

    @property
    def num_full(self) -> int:
        """Groups of full attention."""
        return sum(1 for g in self.groups if g.sliding_window is None)

    def tensor_layers(self) -> list[int]:
        """One layer per cache tensor (the first group's): whose spec sizes that tensor."""
        return list(self.groups[0].layers)

    @classmethod
    def single(cls, num_layers: int = 1, sliding_window: int | None = None) -> KVCacheGroups:
        """One group of ``num_layers`` alike layers."""
        layers = tuple(range(num_layers))
        return cls((KVCacheGroup(layers, sliding_window),), (0,) * num_layers, layers)

    @classmethod
    def from_windows(cls, windows: Sequence[int | None], shapes: Sequence[object] | None = None) -> KVCacheGroups:
        """Group layers by window (``windows[i]`` of layer ``i``; ``None`` is full attention).

        ``shapes[i]`` is what sizes layer ``i``'s cache (heads, head size): layers that would share a tensor
        must agree on it, else the model is refused naming the layers.
        """
        if not windows:
            raise UnsupportedConfigError("a model needs at least one attention layer")
        kinds: dict[int | None, list[int]] = {}
        for i, w in enumerate(windows):
            kinds.setdefault(w, []).append(i)
        size = math.gcd(*(len(v) for v in kinds.values()))
        groups: list[KVCacheGroup] = []
        for window, layers in kinds.items():
            for start in range(0, len(layers), size):
                groups.append(KVCacheGroup(tuple(layers[start : start + size]), window))
        layer_group = [0] * len(windows)
        layer_tensor = [0] * len(windows)
        for g, group in enumerate(groups):
            for j, layer in enumerate(group.layers):
                layer_group[layer], layer_tensor[layer] = g, j
                if shapes is not None and shapes[layer] != shapes[groups[0].layers[j]]:
                    kind = f"sliding window {window}" if (window := group.sliding_window) else "full attention"
                    raise UnsupportedConfigError(
                        f"layer {layer} ({kind}) has KV shape {shapes[layer]} but layer {groups[0].layers[j]}, "
                        f"which shares its cache tensor, has {shapes[groups[0].layers[j]]}: the KV-cache groups "
                        f"need alike layer shapes"
                    )
        return cls(tuple(groups), tuple(layer_group), tuple(layer_tensor))

    @classmethod
    def from_specs(cls, specs: Sequence[AttentionSpec]) -> KVCacheGroups:
        """The groups of a model's attention layers (grouped by window; KV heads and head size must agree)."""
        return cls.from_windows([s.sliding_window for s in specs], [(s.num_kv_heads, s.head_size) for s in specs])
