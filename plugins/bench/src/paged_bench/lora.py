"""The LoRA variant of the model workloads (``--lora N``): the same requests spread over N random adapters.

Before the run, N PEFT checkpoints for the benchmarked model are written into a temporary directory (every
decoder layer's seven projections, rank ``--lora-rank``, small seeded random weights, written with safetensors
directly). Request ``i`` runs on adapter ``i % N`` (round-robin, so any prefix of the workload spreads over
all of them), on a second engine built from the same loaded weights with ``enable_lora=True`` (the run:
``lora_run``). The base model's run (``paged``) is the figure it is compared against.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from paged_core.lora.adapter import PROJECTIONS
from paged_core.lora.request import LoRARequest

LORA = "paged-lora"
"""The LoRA run's name in the report (our engine, same weights, every request on one of the adapters)."""

_PARTS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
"""Which block of a decoder layer holds each projection (the MLP's for the rest), as PEFT names the keys."""


def adapter_tensors(
    shapes: Mapping[tuple[int, str], tuple[int, int]], rank: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """One adapter's PEFT tensors for every ``(layer, projection)`` in ``shapes`` (``(out, in)`` features).

    A is uniform in ``±1/sqrt(in)`` (as PEFT's Kaiming init bounds it) and B normal with std 0.01, rather than
    PEFT's zeros: a trained adapter changes the output, and the cost is the same either way.
    """
    out: dict[str, torch.Tensor] = {}
    for (layer, module), (out_features, in_features) in sorted(shapes.items()):
        key = f"base_model.model.model.layers.{layer}.{_PARTS.get(module, 'mlp')}.{module}"
        bound = 1.0 / math.sqrt(in_features)
        a = (torch.rand(rank, in_features, generator=generator) * 2 - 1) * bound
        out[f"{key}.lora_A.weight"] = a.contiguous()
        out[f"{key}.lora_B.weight"] = (torch.randn(out_features, rank, generator=generator) * 0.01).contiguous()
    return out


def write_adapters(
    directory: Path, shapes: Mapping[tuple[int, str], tuple[int, int]], count: int, rank: int, seed: int
) -> list[LoRARequest]:
    """Write ``count`` seeded random adapters under ``directory``; returns their requests (ids 1..count).

    Only the projections the engine adapts (:data:`~paged_core.lora.adapter.PROJECTIONS`) are written.
    """
    from safetensors.torch import save_file

    targets = {k: v for k, v in shapes.items() if k[1] in PROJECTIONS}
    modules = sorted({m for _, m in targets}, key=PROJECTIONS.index)
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for k in range(count):
        path = directory / f"adapter-{k}"
        path.mkdir(parents=True)
        config = {
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": 2 * rank,
            "target_modules": modules,
            "bias": "none",
            "base_model_name_or_path": None,
        }
        (path / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(adapter_tensors(targets, rank, generator), str(path / "adapter_model.safetensors"))
        requests.append(LoRARequest(f"bench-lora-{k}", k + 1, str(path)))
    return requests


def round_robin(num_requests: int, adapters: Sequence[LoRARequest]) -> list[LoRARequest]:
    """Request ``i``'s adapter: ``adapters[i % len(adapters)]``."""
    if not adapters:
        raise ValueError("round_robin needs at least one adapter")
    return [adapters[i % len(adapters)] for i in range(num_requests)]


def lora_engine_fields(engine: Mapping[str, object], adapters: int, rank: int) -> dict[str, object]:
    """The engine fields of the LoRA run: ``enable_lora``, ``max_loras`` at least ``adapters`` and
    ``max_lora_rank`` at least ``rank``, each only where ``engine`` (the flat fields as given) does not set it."""
    from paged_core.config import ModelConfig

    defaults = ModelConfig()
    fields: dict[str, object] = {"enable_lora": True}
    if engine.get("max_loras") is None:
        fields["max_loras"] = max(defaults.max_loras, adapters)
    if engine.get("max_lora_rank") is None:
        fields["max_lora_rank"] = max(defaults.max_lora_rank, rank)
    return fields
