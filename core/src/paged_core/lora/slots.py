"""Device slots of stacked adapter weights, filled from the host in least-recently-used order."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from paged_core.lora.adapter import LoRAAdapter, LoRAError
from paged_core.lora.request import LoRARequest

GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
"""The fused decoder's projections and the model's modules merged into each (its parts, in output order)."""


@dataclass
class StackedLoRA:
    """One merged projection's adapters: A ``[S, parts * R, in]``; B ``[S, out, parts * R]`` block-diagonal (part
    ``p``'s output rows read only rank columns ``[p * R, (p + 1) * R)``), the scaling folded in."""

    a: torch.Tensor
    b: torch.Tensor
    parts: tuple[tuple[int, int], ...]
    """Each part's ``(first output row, output rows)``."""


class LoRASlots:
    """``max_loras`` slots of every layer's stacked adapter weights, and the adapters registered on the host.

    ``shapes`` maps ``(layer, module)`` to the base model's ``(out_features, in_features)``; ``load`` reads and
    checks an adapter (:func:`~paged_core.lora.adapter.load_adapter` bound to the model). Registered adapters
    stay on the host; :meth:`activate` copies the ones a step needs into slots, evicting the least recently
    used adapter that the step does not need.
    """

    def __init__(
        self,
        shapes: Mapping[tuple[int, str], tuple[int, int]],
        num_layers: int,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        load: Callable[[LoRARequest], LoRAAdapter],
    ) -> None:
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._load = load
        self.registered: dict[int, LoRAAdapter] = {}
        self._requests: dict[int, LoRARequest] = {}
        self.resident: OrderedDict[int, int] = OrderedDict()
        """Adapter id -> slot, least recently used first."""
        self.loads = 0
        """Adapters copied into a slot so far (swaps included)."""
        self.layers: list[dict[str, StackedLoRA]] = []
        for i in range(num_layers):
            groups: dict[str, StackedLoRA] = {}
            for group, modules in GROUPS.items():
                outs = [shapes[(i, m)][0] for m in modules]
                in_features = shapes[(i, modules[0])][1]
                width = len(modules) * max_rank
                starts = [sum(outs[:p]) for p in range(len(outs))]
                groups[group] = StackedLoRA(
                    torch.zeros(max_loras, width, in_features, dtype=dtype, device=device),
                    torch.zeros(max_loras, sum(outs), width, dtype=dtype, device=device),
                    tuple(zip(starts, outs, strict=True)),
                )
            self.layers.append(groups)

    def register(self, lora: LoRARequest) -> LoRAAdapter:
        """Load and check ``lora`` on the host (once per id); raises :class:`LoRAError` naming what is wrong."""
        known = self._requests.get(lora.id)
        if known is not None:
            if (known.name, known.path) != (lora.name, lora.path):
                raise LoRAError(
                    f"LoRA id {lora.id} already names adapter {known.name!r} ({known.path}), not {lora.name!r} "
                    f"({lora.path})"
                )
            return self.registered[lora.id]
        adapter = self._load(lora)
        self.registered[lora.id] = adapter
        self._requests[lora.id] = lora
        return adapter

    def remove(self, lora_id: int) -> bool:
        """Forget an adapter (its slot is freed); False if it was not registered."""
        self._requests.pop(lora_id, None)
        slot = self.resident.pop(lora_id, None)
        if slot is not None:
            self._clear(slot)
        return self.registered.pop(lora_id, None) is not None

    def activate(self, lora_ids: Iterable[int]) -> dict[int, int]:
        """Make every adapter in ``lora_ids`` (registered) resident; returns id -> slot.

        More distinct adapters than slots is a scheduler bug (it admits at most ``max_loras`` at once).
        """
        wanted = list(dict.fromkeys(lora_ids))
        if len(wanted) > self.max_loras:
            raise LoRAError(f"a step uses {len(wanted)} adapters, more than max_loras={self.max_loras}")
        for lora_id in wanted:
            if lora_id in self.resident:
                self.resident.move_to_end(lora_id)
                continue
            adapter = self.registered.get(lora_id)
            if adapter is None:
                raise LoRAError(f"LoRA id {lora_id} is not registered")
            used = set(self.resident.values())
            free = [s for s in range(self.max_loras) if s not in used]
            if free:
                slot = free[0]
            else:
                victim = next(i for i in self.resident if i not in wanted)
                slot = self.resident.pop(victim)
            self._write(slot, adapter)
            self.resident[lora_id] = slot
        return {i: self.resident[i] for i in wanted}

    def _write(self, slot: int, adapter: LoRAAdapter) -> None:
        self._clear(slot)
        for i, groups in enumerate(self.layers):
            for group, modules in GROUPS.items():
                stacked = groups[group]
                for p, (module, (start, rows)) in enumerate(zip(modules, stacked.parts, strict=True)):
                    pair = adapter.weights.get((i, module))
                    if pair is None:
                        continue
                    a, b = pair
                    r, col = a.shape[0], p * self.max_rank
                    stacked.a[slot, col : col + r].copy_(a)
                    stacked.b[slot, start : start + rows, col : col + r].copy_(b)
        self.loads += 1

    def _clear(self, slot: int) -> None:
        for groups in self.layers:
            for stacked in groups.values():
                stacked.a[slot].zero_()
                stacked.b[slot].zero_()
