"""Loading a GGUF with its linear weights kept packed (the default for GGUF files; ``--quantization none`` opts out).

transformers builds the model's modules (no weight initialisation: every
parameter is then read from the file), and its GGUF tables map tensor names and
undo the converter's row permutations. Each linear weight of a format in
:data:`paged_core.quant.BY_GGML_TYPE` becomes a :class:`PackedLinearModule`
over the file's bytes (rows permuted where the converter permuted them:
a permutation of output rows moves whole packed rows); every other tensor
(embeddings, norms, a linear weight of another type) is dequantized by
``gguf`` into the compute dtype, as transformers would. A tied LM head reads
the token embedding's packed bytes. A MoE layer's 3-D expert tensors stay packed
too (:mod:`paged_core.loading.gguf_experts`). Anything that cannot be read, or whose
size or shape disagrees with the model's config, is refused naming the tensor.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paged_core.contract.moe import ExpertWeight
from paged_core.errors import ConfigError, WeightFormatError
from paged_core.loading.gguf_experts import (
    EXPERT_LEAVES,
    LayerExperts,
    expert_role,
    expert_target,
    experts_modules_of,
    fill_parameters,
    fix_moe_config,
    layer_weights,
    read_expert_tensor,
)
from paged_core.quant import BY_GGML_TYPE, QuantizedWeight, arena
from paged_core.runner.packed_experts import PackedExpertsModule
from paged_core.runner.packed_linear import PackedLinearModule, replace_module

log = logging.getLogger("paged.engine")


def _type_name(tensor: Any) -> str:
    return getattr(tensor.tensor_type, "name", str(tensor.tensor_type))


def _check_size(tensor: Any) -> None:
    """A tensor's byte count must be its element count in whole blocks of its type."""
    from gguf import GGML_QUANT_SIZES

    block, type_size = GGML_QUANT_SIZES[tensor.tensor_type]
    elements = int(np.prod([int(d) for d in tensor.shape]))
    row = int(tensor.shape[0])
    if row % block:
        raise WeightFormatError(
            f"{tensor.name}: {_type_name(tensor)} rows of {row} values are not whole blocks of {block}"
        )
    want = elements // block * type_size
    if int(tensor.n_bytes) != want:
        raise WeightFormatError(
            f"{tensor.name}: {_type_name(tensor)} {list(tensor.shape)} needs {want} bytes "
            f"({elements // block} blocks of {type_size}), the file has {int(tensor.n_bytes)} "
            "(truncated or a wrong block count)"
        )


def _dense(tensor: Any) -> np.ndarray:
    """The tensor's values as a numpy array in the model's ``[out, in]`` order (gguf's dequantizers)."""
    from gguf import GGMLQuantizationType, dequantize

    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, KeyError, ValueError) as exc:
        raise WeightFormatError(
            f"{tensor.name}: tensor type {_type_name(tensor)} cannot be read (no packed kernel "
            f"and gguf cannot dequantize it: {exc})"
        ) from None
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        values = values.reshape([int(d) for d in reversed(tensor.shape)])
    return np.asarray(values)


def _row_permutation(processor: Any, name: str, rows: int, extra: dict[str, Any]) -> np.ndarray | None:
    """The output-row order transformers' processor gives ``name`` (``None``: unchanged).

    Found by running the processor on the row indices: a permuting
    processor (Llama's q/k) permutes them, an identity one returns them. A
    processor that does anything else raises, since packed rows can only move.
    """
    index = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    result = processor.process(weights=index, name=name, **extra).weights
    order = np.asarray(result).reshape(-1)
    if order.shape != (rows,) or not np.array_equal(np.sort(order), np.arange(rows)):
        raise WeightFormatError(f"{name}: transformers transforms this tensor beyond a row permutation")
    return None if np.array_equal(order, np.arange(rows)) else order.astype(np.int64)


@contextmanager
def _cached_name_maps() -> Iterator[None]:
    """transformers' name mapping rebuilds gguf's table for every submodule (24 s for SmolLM2); build each once."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def load_packed_gguf(path: Path, config: Any, dtype: torch.dtype) -> Any:
    """The transformers causal LM for ``config`` with its GGUF linear weights packed (on the CPU)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    from paged_core.loading.loader import gguf_reader

    reader = gguf_reader(path)
    arch = read_field(reader, "general.architecture")[0]  # type: ignore[no-untyped-call]
    fix_moe_config(reader, config)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    model.tie_weights()  # skipped with the initialisation; a dense tied head must share the embedding
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())  # type: ignore[no-untyped-call]
    with _cached_name_maps():
        name_map = get_gguf_hf_weights_map(model, processor)
    params = dict(model.named_parameters(remove_duplicate=False))
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    extra = {"tensor_key_mapping": name_map, "parsed_parameters": {"config": config.to_dict()}}
    loaded: set[str] = set()
    packed: dict[str, QuantizedWeight] = {}
    embed_name = next((n for n, m in model.named_modules() if m is model.get_input_embeddings()), None)
    embed_packed: QuantizedWeight | None = None
    experts_of = experts_modules_of(model, name_map)
    layers: dict[str, LayerExperts] = {}
    for tensor in reader.tensors:
        hf_name = name_map.get(tensor.name) or expert_target(name_map, tensor.name)
        if hf_name is None:
            continue
        _check_size(tensor)
        module_name, _, leaf = hf_name.rpartition(".")
        fmt = BY_GGML_TYPE.get(int(tensor.tensor_type))
        role = expert_role(tensor.name)
        if role is not None and module_name in experts_of:
            layer = layers.setdefault(module_name, LayerExperts(experts_of[module_name]))
            layer.parts[role] = read_expert_tensor(tensor, fmt, layer.module, _dense)
            layer.names[role] = tensor.name
            continue
        if fmt is not None and leaf == "weight" and module_name in linears:
            linear = linears[module_name]
            packed[module_name] = _packed(
                tensor, fmt, (linear.out_features, linear.in_features), hf_name, processor, extra
            )
            loaded.add(hf_name)
            continue
        if fmt is not None and leaf == "weight" and module_name == embed_name:
            embed = model.get_input_embeddings().weight
            embed_packed = _packed(tensor, fmt, tuple(embed.shape), hf_name, processor, extra)
        if fmt is None and leaf == "weight" and module_name in linears:
            log.info("%s: %s is not a packed format; dequantized to %s", tensor.name, _type_name(tensor), dtype)
        values = processor.process(weights=_dense(tensor), name=tensor.name, **extra).weights  # type: ignore[no-untyped-call]
        param = params.get(hf_name)
        if param is None:
            continue
        if tuple(values.shape) != tuple(param.shape):
            raise WeightFormatError(
                f"{tensor.name}: shape {list(values.shape)} but the config makes {hf_name} {list(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.array(values, copy=True)))
        loaded.add(hf_name)
    experts: dict[str, tuple[ExpertWeight, ExpertWeight]] = {}
    for name, layer in layers.items():
        weights = layer_weights(name, layer, dtype)
        if weights is None:
            fill_parameters(layer)
        else:
            experts[name] = weights
        loaded.update(f"{name}.{leaf}" for leaf in EXPERT_LEAVES)
    packed, embed_packed, experts = _gathered(model, packed, embed_packed, experts)
    _install(model, linears, packed, loaded, config, embed_packed)
    for name, (gate_up, down) in experts.items():
        replace_module(model, name, PackedExpertsModule(gate_up, down, layers[name].module.act_fn, name))
    if experts:
        log.info("%s: the experts of %d MoE layer(s) kept packed", path.name, len(experts))
    missing = [n for n in dict(model.named_parameters()) if n not in loaded]
    if missing:
        raise ConfigError(
            f"{path}: no tensor in the file for {', '.join(missing[:8])}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        )
    return model


def _packed(
    tensor: Any, fmt: Any, shape: tuple[int, ...], hf_name: str, processor: Any, extra: dict[str, Any]
) -> QuantizedWeight:
    """The tensor's bytes as a :class:`QuantizedWeight` of the model's ``shape``, rows in transformers' order."""
    n, k = int(tensor.shape[1]), int(tensor.shape[0])
    if (n, k) != tuple(shape):
        raise WeightFormatError(f"{tensor.name}: shape [out {n}, in {k}] but the config makes {hf_name} {list(shape)}")
    data = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True)).reshape(n, -1)
    weight = QuantizedWeight(fmt, (n, k), data, None, tensor.name)
    order = _row_permutation(processor, tensor.name, n, extra)
    return weight if order is None else weight.select_rows(torch.from_numpy(order))


def _gathered(
    model: torch.nn.Module,
    packed: dict[str, QuantizedWeight],
    embed_packed: QuantizedWeight | None,
    experts: dict[str, tuple[ExpertWeight, ExpertWeight]],
) -> tuple[dict[str, QuantizedWeight], QuantizedWeight | None, dict[str, tuple[ExpertWeight, ExpertWeight]]]:
    """The packed weights moved into one huge-page buffer (:mod:`paged_core.quant.arena`) in the model's module
    order (a layer's q, k, v, o, gate, up, down, or its packed experts, then the next layer; the packed embedding,
    the tied LM head read last, at the end): decoding streams them front to back, and q/k/v and gate/up end up
    adjacent. Packed experts are copied out of the file's mapping here (dense ones stay where they are)."""
    keys: list[tuple[str, int]] = []
    weights: list[QuantizedWeight] = []
    for name, _ in model.named_modules():
        if name in packed:
            keys.append((name, -1))
            weights.append(packed[name])
        for i, w in enumerate(experts.get(name, ())):
            if isinstance(w, QuantizedWeight):
                keys.append((name, i))
                weights.append(w)
    moved = arena.gather(weights + ([embed_packed] if embed_packed is not None else []))
    out = dict(packed)
    parts = {name: list(pair) for name, pair in experts.items()}
    for (name, i), w in zip(keys, moved, strict=False):
        if i < 0:
            out[name] = w
        else:
            parts[name][i] = w
    gathered = {name: (pair[0], pair[1]) for name, pair in parts.items()}
    return out, moved[-1] if embed_packed is not None else None, gathered


def _install(
    model: Any,
    linears: dict[str, torch.nn.Linear],
    packed: dict[str, QuantizedWeight],
    loaded: set[str],
    config: Any,
    embed_packed: QuantizedWeight | None,
) -> None:
    """Swap the packed linears in; a tied LM head reads the token embedding's packed bytes."""
    head = model.get_output_embeddings()
    head_name = next((n for n, m in linears.items() if m is head), None)
    text = config.get_text_config()
    if (
        head_name is not None
        and head_name not in packed
        and embed_packed is not None
        and getattr(text, "tie_word_embeddings", False)
    ):
        packed[head_name] = embed_packed
    for name, weight in packed.items():
        linear = linears[name]
        bias = linear.bias.detach() if linear.bias is not None else None
        replace_module(model, name, PackedLinearModule(weight, bias))
        if bias is not None and f"{name}.bias" not in loaded:
            raise ConfigError(f"no tensor in the file for {name}.bias")
    if head_name is not None and head_name in packed:
        loaded.add(f"{head_name}.weight")
