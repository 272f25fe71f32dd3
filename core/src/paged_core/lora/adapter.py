"""Loading a PEFT LoRA checkpoint and checking it against the base model's projections."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from paged_core.errors import PagedError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The decoder projections an adapter may target (attention and MLP of every layer)."""

_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class LoRAError(PagedError):
    """An adapter that cannot serve this base model: the message names the adapter and what is wrong."""


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter on the host: per ``(layer, projection)``, A ``[r, in]`` and B ``[out, r]`` with the scaling
    (``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA) folded into B, both fp32."""

    name: str
    id: int
    rank: int
    weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(m for _, m in self.weights)


def load_adapter(
    name: str, adapter_id: int, path: str, shapes: Mapping[tuple[int, str], tuple[int, int]], max_rank: int
) -> LoRAAdapter:
    """Read ``path`` (PEFT's ``adapter_config.json`` and ``adapter_model.safetensors``) and check it.

    ``shapes`` maps ``(layer, projection)`` to the base model's ``(out_features, in_features)``. Raises
    :class:`LoRAError` naming the adapter for a missing or malformed checkpoint, a rank above ``max_rank``, a
    module the model lacks or the engine does not adapt, a shape that is not the base model's, or a PEFT
    feature not served (DoRA, bias training, ``modules_to_save``, ``alpha_pattern``).
    """
    where = f"LoRA adapter {name!r} ({path})"
    root = Path(path)
    config_file, weights_file = root / "adapter_config.json", root / "adapter_model.safetensors"
    if not root.is_dir():
        raise LoRAError(f"{where}: no such directory")
    if not config_file.is_file():
        raise LoRAError(f"{where}: adapter_config.json is missing")
    if not weights_file.is_file():
        raise LoRAError(f"{where}: adapter_model.safetensors is missing (only safetensors checkpoints load)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise LoRAError(f"{where}: adapter_config.json is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAError(f"{where}: adapter_config.json is not a JSON object")
    _check_config(where, config)
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(weights_file))
    except Exception as exc:  # safetensors raises several types for a damaged file
        raise LoRAError(f"{where}: adapter_model.safetensors does not load: {exc}") from None
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise LoRAError(f"{where}: tensor {key!r} is not a LoRA A or B of a decoder projection")
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        if module not in PROJECTIONS:
            raise LoRAError(f"{where}: targets {module!r}, which is not one of {', '.join(PROJECTIONS)}")
        pairs.setdefault((layer, module), {})[which] = tensor
    if not pairs:
        raise LoRAError(f"{where}: no LoRA weights in adapter_model.safetensors")
    alpha_given = config.get("lora_alpha", config.get("r", 8))
    alpha = float(alpha_given) if isinstance(alpha_given, (int, float)) else 8.0
    rslora = bool(config.get("use_rslora", False))
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    rank = 0
    for (layer, module), pair in sorted(pairs.items()):
        what = f"layers.{layer}.{module}"
        if set(pair) != {"A", "B"}:
            raise LoRAError(f"{where}: {what} has lora_{''.join(pair)} but not both lora_A and lora_B")
        if (layer, module) not in shapes:
            raise LoRAError(f"{where}: {what} is not a projection of the base model")
        a, b = pair["A"], pair["B"]
        out_features, in_features = shapes[(layer, module)]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape != (out_features, r):
            raise LoRAError(
                f"{where}: {what} has A {list(a.shape)} and B {list(b.shape)}; the base model needs "
                f"A [r, {in_features}] and B [{out_features}, r] (an adapter of another base model?)"
            )
        if r > max_rank:
            raise LoRAError(f"{where}: {what} has rank {r}, above max_lora_rank={max_rank}")
        scaling = alpha / math.sqrt(r) if rslora else alpha / r
        weights[(layer, module)] = (a.float().contiguous(), (b.float() * scaling).contiguous())
        rank = max(rank, r)
    return LoRAAdapter(name, adapter_id, rank, weights)


def _check_config(where: str, config: dict[str, object]) -> None:
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise LoRAError(f"{where}: peft_type is {peft_type!r}; only LORA adapters are served")
    if config.get("use_dora"):
        raise LoRAError(f"{where}: DoRA adapters (use_dora) are not served")
    if config.get("bias", "none") != "none":
        raise LoRAError(f"{where}: bias={config.get('bias')!r} (trained biases) is not served; only bias='none'")
    if config.get("modules_to_save"):
        raise LoRAError(f"{where}: modules_to_save {config.get('modules_to_save')!r} is not served")
    if config.get("alpha_pattern"):
        raise LoRAError(f"{where}: alpha_pattern (per-module lora_alpha) is not served")
    for field in ("r", "lora_alpha"):
        value = config.get(field)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0):
            raise LoRAError(f"{where}: {field} must be a positive number, got {value!r}")


def model_shapes(model: object) -> dict[tuple[int, str], tuple[int, int]]:
    """``(layer, projection) -> (out_features, in_features)`` of a transformers decoder's projections."""
    shapes: dict[tuple[int, str], tuple[int, int]] = {}
    for i, layer in enumerate(model.model.layers):  # type: ignore[attr-defined]
        for part in ("self_attn", "mlp"):
            block = getattr(layer, part)
            for name in PROJECTIONS:
                module = getattr(block, name, None)
                if module is not None:
                    shapes[(i, name)] = (int(module.out_features), int(module.in_features))
    return shapes
