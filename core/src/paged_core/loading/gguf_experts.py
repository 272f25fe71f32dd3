"""A GGUF MoE file's expert tensors kept packed (part of :mod:`paged_core.loading.gguf_packed`).

llama.cpp stores a MoE layer's experts as three 3-D tensors: ``blk.N.ffn_gate_exps`` and ``ffn_up_exps``
``[E, I, H]`` and ``ffn_down_exps`` ``[E, H, I]`` (row-major: expert ``e``'s rows follow expert ``e - 1``'s). Each
is ``E * N`` packed rows as it stands, the layout of :class:`~paged_core.contract.moe.PackedExperts`: ``down``
is taken as is, gate and up are interleaved per expert once (:func:`~paged_core.contract.moe.merge_gate_up`),
and the layer's experts module becomes a :class:`~paged_core.runner.packed_experts.PackedExpertsModule`. The
dense parameters transformers allocated for them are dropped untouched (never filled, so never resident).

A layer whose three tensors are all float (F32/F16/BF16) is read into transformers' own parameters, as before;
a packed tensor of a format paged has no kernel for is dequantized into that layer's (dense) experts. transformers
reads some MoE hyperparameters from the file incompletely; :func:`fix_moe_config` completes them.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from paged_core.contract.moe import ExpertWeight, merge_gate_up
from paged_core.errors import ConfigError, UnsupportedConfigError, WeightFormatError
from paged_core.quant import QuantizedWeight, WeightFormat
from paged_core.runner.experts import experts_refusal

log = logging.getLogger("paged.engine")

_EXPERT_TENSOR = re.compile(r"blk\.\d+\.ffn_(?P<role>gate|up|down)_exps(?:\.weight)?")
"""A 3-D expert tensor's GGUF name (transformers' name map holds them without ``.weight``)."""
EXPERT_LEAVES = ("gate_up_proj", "down_proj")

CONFIG_KEYS: dict[str, dict[str, str]] = {
    # transformers 5 maps neither (its Qwen3MoeConfig default of 768 happens to be Qwen3-30B-A3B's).
    "qwen3moe": {"expert_feed_forward_length": "moe_intermediate_size"},
    "qwen2moe": {
        "expert_feed_forward_length": "moe_intermediate_size",
        "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
    },
}
"""Per GGUF architecture: metadata keys (after ``{arch}.``) that transformers' config reading leaves out, and the
config attribute each sets."""


def fix_moe_config(reader: Any, config: Any) -> list[str]:
    """Set the MoE sizes transformers did not read from the file (:data:`CONFIG_KEYS`); returns what changed."""
    from transformers.modeling_gguf_pytorch_utils import read_field

    arch = read_field(reader, "general.architecture")[0]  # type: ignore[no-untyped-call]
    text = config.get_text_config()
    changed = []
    for key, attr in CONFIG_KEYS.get(arch, {}).items():
        found = read_field(reader, f"{arch}.{key}")  # type: ignore[no-untyped-call]
        if found and hasattr(text, attr) and getattr(text, attr) != int(found[0]):
            setattr(text, attr, int(found[0]))
            changed.append(f"{attr}={int(found[0])}")
    return changed


def experts_modules_of(model: torch.nn.Module, name_map: dict[str, str]) -> dict[str, torch.nn.Module]:
    """The experts modules the file's expert tensors map to (module name: module)."""
    modules = dict(model.named_modules())
    found = {}
    for gguf_name, hf_name in name_map.items():
        module_name, _, leaf = hf_name.rpartition(".")
        if _EXPERT_TENSOR.fullmatch(gguf_name) and leaf in EXPERT_LEAVES and module_name in modules:
            found[module_name] = modules[module_name]
    return found


@dataclass
class LayerExperts:
    """One layer's expert tensors as read: each packed rows (a view of the file) or dense ``[E, N, K]``."""

    module: Any
    """transformers' experts module (its ``gate_up_proj`` ``[E, 2I, H]`` gives the sizes)."""
    parts: dict[str, ExpertWeight] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    """role: the GGUF tensor name (for errors)."""


def expert_target(name_map: dict[str, str], tensor_name: str) -> str | None:
    """The transformers parameter an expert tensor fills (``...experts.gate_up_proj`` for gate and up), else
    ``None``."""
    if expert_role(tensor_name) is None:
        return None
    return name_map.get(tensor_name.removesuffix(".weight"))


def expert_role(tensor_name: str) -> str | None:
    """``gate``, ``up`` or ``down`` for a GGUF expert tensor's name, else ``None``."""
    m = _EXPERT_TENSOR.fullmatch(tensor_name)
    return m["role"] if m else None


def read_expert_tensor(tensor: Any, fmt: WeightFormat | None, module: Any, dense: Any) -> ExpertWeight:
    """One 3-D expert tensor as packed rows ``(E * N, K)`` over the file's bytes (``fmt`` a packed format), or as
    ``[E, N, K]`` floats from ``dense(tensor)``. Refuses a shape the module's config disagrees with, naming it."""
    role = expert_role(tensor.name)
    e, two_i, h = (int(d) for d in module.gate_up_proj.shape)
    want = (e, h, two_i // 2) if role == "down" else (e, two_i // 2, h)
    have = tuple(int(d) for d in reversed([int(d) for d in tensor.shape]))
    if len(have) != 3 or have != want:
        raise WeightFormatError(
            f"{tensor.name}: shape {list(have)} but the config makes these experts {list(want)} "
            "(experts, rows, columns)"
        )
    if fmt is None:
        if tensor.tensor_type.name not in ("F32", "F16", "BF16"):
            log.info("%s: %s is not a packed format; dequantized", tensor.name, tensor.tensor_type.name)
        return torch.from_numpy(np.array(dense(tensor), dtype=np.float32, copy=True)).reshape(want)
    with warnings.catch_warnings():  # the reader maps the file read-only; these bytes are only ever read
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(tensor.data).view(torch.uint8).reshape(e * want[1], -1)
    return QuantizedWeight(fmt, (e * want[1], h if role != "down" else two_i // 2), data, None, tensor.name)


def _dense(w: ExpertWeight, experts: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        return w.dequantize(dtype).reshape(experts, w.out_features // experts, w.in_features)
    return w.to(dtype)


def layer_weights(name: str, layer: LayerExperts, dtype: torch.dtype) -> tuple[ExpertWeight, ExpertWeight] | None:
    """``(gate_up, down)`` for a :class:`~paged_core.runner.packed_experts.PackedExpertsModule`, or ``None`` when
    every part is dense (then transformers' parameters take them). Gate and up merge packed when they share a
    format, else dense. An experts module whose layout is not the contract's (biases, transposed weights, another
    gating: :func:`~paged_core.runner.experts.experts_refusal`) is refused naming the layer."""
    missing = [r for r in ("gate", "up", "down") if r not in layer.parts]
    if missing:
        present = ", ".join(layer.names.values())
        raise ConfigError(f"{name}: the file has {present} but no ffn_{'/'.join(missing)}_exps for this layer")
    reason = experts_refusal(layer.module)
    if reason is not None:
        raise UnsupportedConfigError(
            f"{name}: its expert tensors cannot be loaded packed: {reason}; pass --quantization none to load the "
            "file dequantized by transformers"
        )
    gate, up, down = layer.parts["gate"], layer.parts["up"], layer.parts["down"]
    if not any(isinstance(w, QuantizedWeight) for w in (gate, up, down)):
        return None
    e = int(layer.module.gate_up_proj.shape[0])
    if isinstance(gate, QuantizedWeight) and isinstance(up, QuantizedWeight) and gate.format == up.format:
        gate_up: ExpertWeight = merge_gate_up(gate, up, e)
    else:
        gate_up = torch.cat((_dense(gate, e, dtype), _dense(up, e, dtype)), dim=1)
    return gate_up, down if isinstance(down, QuantizedWeight) else down.to(dtype)


def fill_parameters(layer: LayerExperts) -> None:
    """Every part dense: into transformers' ``gate_up_proj`` (gate rows, then up rows) and ``down_proj``."""
    module = layer.module
    gate_up, down = module.gate_up_proj, module.down_proj
    inter = int(gate_up.shape[1]) // 2
    gate, up, down_values = (layer.parts[r] for r in ("gate", "up", "down"))
    assert isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor) and isinstance(down_values, torch.Tensor)
    with torch.no_grad():
        gate_up[:, :inter].copy_(gate)
        gate_up[:, inter:].copy_(up)
        down.copy_(down_values)
