"""Adapter slots: stacked weights laid out per merged projection, least-recently-used swaps, ids that clash."""

from __future__ import annotations

import pytest
import torch

from paged_core.lora import LoRAAdapter, LoRAError, LoRARequest, LoRASlots

SHAPES = {(0, m): (8, 4) for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")}
SHAPES |= {(0, "o_proj"): (4, 8), (0, "down_proj"): (4, 8)}


def _adapter(lora: LoRARequest, modules: tuple[str, ...] = ("k_proj",), rank: int = 2) -> LoRAAdapter:
    weights = {}
    for m in modules:
        out, inp = SHAPES[(0, m)]
        weights[(0, m)] = (torch.full((rank, inp), float(lora.id)), torch.full((out, rank), -float(lora.id)))
    return LoRAAdapter(lora.name, lora.id, rank, weights)


def _slots(max_loras: int = 2) -> tuple[LoRASlots, list[LoRARequest]]:
    loras = [LoRARequest(f"a{i}", i, f"/x/{i}") for i in (1, 2, 3)]
    return LoRASlots(SHAPES, 1, max_loras, 4, torch.float32, torch.device("cpu"), _adapter), loras


def test_a_part_lands_in_its_rank_columns_and_output_rows() -> None:
    slots, loras = _slots()
    slots.register(loras[0])
    slot = slots.activate([1])[1]
    qkv = slots.layers[0]["qkv"]
    assert qkv.a.shape == (2, 3 * 4, 4) and qkv.b.shape == (2, 24, 12)
    # k_proj is part 1: A rows 4..5 (rank 2 of 4), B rows 8..15 x columns 4..5; everything else zero.
    assert torch.equal(qkv.a[slot, 4:6], torch.ones(2, 4)) and qkv.a[slot].abs().sum() == 8
    assert torch.equal(qkv.b[slot, 8:16, 4:6], -torch.ones(8, 2)) and qkv.b[slot].abs().sum() == 16
    assert slots.layers[0]["down"].a[slot].abs().sum() == 0  # not targeted


def test_least_recently_used_gives_way_but_never_one_the_step_needs() -> None:
    slots, loras = _slots(max_loras=2)
    for lora in loras:
        slots.register(lora)
    first = slots.activate([1, 2])
    slots.activate([1])  # 2 is now the least recently used
    third = slots.activate([3, 1])
    assert third[3] == first[2] and third[1] == first[1] and 2 not in slots.resident
    assert slots.layers[0]["qkv"].a[third[3]].max() == 3  # the slot holds adapter 3 only
    assert slots.loads == 3
    with pytest.raises(LoRAError, match="more than max_loras=2"):
        slots.activate([1, 2, 3])
    with pytest.raises(LoRAError, match="LoRA id 7 is not registered"):
        slots.activate([7])


def test_an_id_names_one_adapter() -> None:
    slots, loras = _slots()
    slots.register(loras[0])
    assert slots.register(LoRARequest("a1", 1, "/x/1")) is slots.registered[1]
    with pytest.raises(LoRAError, match="LoRA id 1 already names adapter 'a1'"):
        slots.register(LoRARequest("other", 1, "/y"))
    assert slots.remove(1) and not slots.remove(1)
