"""Splitting a loaded model across tensor-parallel ranks in place, without forking its code.

The plan names each projection ``colwise`` (output features split: q/k/v, gate/up) or ``rowwise``
(input features split: o, down; their partial sums are all-reduced). It is transformers' own
``base_model_tp_plan`` where the model's config declares one, else :data:`FALLBACK_PLAN` (the
Llama-family names, which also covers models loaded from GGUF). Slicing contiguous row blocks of
q/k/v gives each rank whole heads: rank ``r`` holds query heads ``[r*H/N, (r+1)*H/N)`` and KV heads
``[r*K/N, (r+1)*K/N)``, which is exactly the KV group those query heads read. Embeddings, norms and
the LM head stay whole on every rank (only rank 0 samples; the others' logits are dropped).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch

from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.group import TPGroup

FALLBACK_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}
"""The plan for Llama-family module names when the config declares none."""

KINDS = {
    "colwise": "colwise",
    "rowwise": "rowwise",
    "colwise_rep": "colwise",
    "rowwise_rep": "rowwise",
    "local_colwise": "colwise",
    "local_rowwise": "rowwise",
}
"""transformers' plan words we apply, by the split they mean (replication variants differ only in
how transformers lays out activations, which this in-place split never changes)."""

REPLICATED = frozenset({"replicated_with_grad_allreduce"})
"""Plan words for modules every rank keeps whole (Qwen3's per-head q/k norms; the grad all-reduce is training's)."""


def tp_plan(model: Any) -> dict[str, str]:
    """The model's own plan (its config's ``base_model_tp_plan``) or the fallback, refusing words we cannot apply."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    plan = dict(getattr(config, "base_model_tp_plan", None) or FALLBACK_PLAN)
    plan = {k: v for k, v in plan.items() if v not in REPLICATED}
    unknown = {k: v for k, v in plan.items() if v not in KINDS}
    if unknown:
        raise UnsupportedConfigError(
            f"{type(model).__name__}: tensor-parallel plan entries this engine cannot apply: {unknown} "
            f"(supported: {', '.join(sorted(KINDS))})"
        )
    return plan


def _base(model: Any) -> tuple[str, torch.nn.Module]:
    """The decoder stack the plan's names are relative to (``model.model`` for causal LMs)."""
    prefix = getattr(model, "base_model_prefix", "model")
    inner = getattr(model, prefix, None)
    return (prefix, inner) if isinstance(inner, torch.nn.Module) else ("", model)


def _slice(t: torch.Tensor, dim: int, rank: int, world: int, name: str) -> torch.Tensor:
    size = t.shape[dim]
    if size % world:
        raise UnsupportedConfigError(f"{name}: dimension {dim} of size {size} does not split over {world} ranks")
    step = size // world
    return t.narrow(dim, rank * step, step).contiguous()


def shard_model(model: Any, group: TPGroup) -> dict[str, str]:
    """Keep this rank's share of every planned projection; all-reduce after the row-parallel ones.

    Returns the module names split and how. The all-reduce is a forward hook on the module, so the
    transformers path needs nothing else; the fused decoder, which calls no modules, reduces itself
    (:class:`~paged_core.runner.fused.FusedDecoder`, ``reduce``).
    """
    rank, world = group.rank, group.world_size
    _, base = _base(model)
    plan = tp_plan(model)
    applied: dict[str, str] = {}
    for name, module in base.named_modules():
        kind = next((KINDS[v] for pattern, v in plan.items() if fnmatch.fnmatchcase(name, pattern)), None)
        if kind is None:
            continue
        if not isinstance(module, torch.nn.Linear):
            raise UnsupportedConfigError(
                f"{name}: tensor-parallel plan says {kind} but it is a {type(module).__name__}, not a Linear"
            )
        with torch.no_grad():
            if kind == "colwise":
                module.weight = torch.nn.Parameter(_slice(module.weight, 0, rank, world, name), requires_grad=False)
                if module.bias is not None:
                    module.bias = torch.nn.Parameter(_slice(module.bias, 0, rank, world, name), requires_grad=False)
                module.out_features = module.weight.shape[0]
            else:
                module.weight = torch.nn.Parameter(_slice(module.weight, 1, rank, world, name), requires_grad=False)
                if module.bias is not None and rank != 0:  # the bias is added once, by rank 0, before the sum
                    module.bias = None  # type: ignore[assignment]
                module.in_features = module.weight.shape[1]
                module.register_forward_hook(_all_reduce_hook(group))
        applied[name] = kind
    if not applied:
        raise UnsupportedConfigError(f"{type(model).__name__}: the tensor-parallel plan matched no module")
    return applied


def _all_reduce_hook(group: TPGroup) -> Any:
    def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return group.all_reduce(output)

    return hook
