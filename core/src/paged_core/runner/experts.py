"""Routing transformers' ``*Experts`` modules through the backend's routed-experts op.

transformers 5 keeps a MoE layer's experts as one module with 3-D weights (``gate_up_proj`` ``[E, 2I, H]``,
``down_proj`` ``[E, H, I]``) whose forward, decorated with ``use_experts_implementation``, looks up
``config._experts_implementation`` in its experts-function registry (as attention looks up
``_attn_implementation``) and is called with each token's ``top_k_index`` and ``top_k_weights`` from the
model's own router. :func:`route_model_experts` registers :data:`EXPERTS_IMPLEMENTATION` there and selects it
for the model's experts modules whose layout the contract serves (:func:`experts_refusal`), packing each once with
the backend's ``pack_experts`` (:func:`pack_experts_for`); inside an engine step (:func:`experts_step`, which
names the backend's ops) such a module runs the backend's :meth:`FusedOps.experts
<paged_core.contract.fused_ops.FusedOps.experts>` (the op for a routing computed elsewhere: the model's router
already ran). Outside a step (the HF baselines, ``generate`` on the same model) and for modules the contract does
not serve, the implementation the model had before runs, so transformers' own path is unchanged.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.moe import Activation, ExpertWeight, PackedExperts
from paged_core.errors import UnsupportedConfigError
from paged_core.quant import QuantizedWeight

log = logging.getLogger("paged.engine")

EXPERTS_IMPLEMENTATION = "paged"
"""The name this module registers in transformers' experts-function registry."""

_LAYOUT_FLAGS = {
    "has_gate": (True, "has no gate (an ungated MLP per expert)"),
    "has_bias": (False, "has biases"),
    "is_transposed": (False, "stores its weights transposed"),
    "is_concatenated": (True, "interleaves gate and up rows"),
    "has_post_expert_norm": (False, "normalises each expert's output"),
    "_is_expert_parallel": (False, "is split for expert parallelism"),
}
"""``use_experts_implementation``'s layout flags on an experts module: the value the contract's layout needs, and
what another value means."""


def experts_modules(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of each of ``model``'s experts modules (classes decorated with
    ``use_experts_implementation``: their instances carry its layout flags); none for what is not a module."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "has_gate") and hasattr(m, "is_transposed")]


def experts_activation(module: torch.nn.Module) -> Activation | None:
    """The contract's name of the module's gated activation (``silu`` or ``gelu_tanh``), or ``None`` if another."""
    from transformers.activations import GELUTanh, SiLUActivation

    act = getattr(module, "act_fn", None)
    if isinstance(act, (SiLUActivation, torch.nn.SiLU)):
        return "silu"
    if isinstance(act, GELUTanh):
        return "gelu_tanh"
    if isinstance(act, torch.nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    return None


def experts_refusal(module: torch.nn.Module) -> str | None:
    """Why the contract's routed experts cannot run ``module`` (an experts module of transformers), or ``None``.

    The contract's layout is a gated MLP per expert, no biases, ``gate_up_proj`` ``[E, 2I, H]`` (the ``I`` gate
    rows then the ``I`` up rows) and ``down_proj`` ``[E, H, I]``, a SiLU or tanh-GELU gate, transformers' default
    gating (``act(gate) * up``), every expert on this rank.
    """
    from transformers.integrations.moe import _default_apply_gate

    for flag, (needed, meaning) in _LAYOUT_FLAGS.items():
        if getattr(module, flag, needed) != needed:
            return f"{type(module).__name__} {meaning} ({flag} = {getattr(module, flag)!r})"
    if getattr(type(module), "_apply_gate", _default_apply_gate) is not _default_apply_gate:
        return f"{type(module).__name__} has its own gating (_apply_gate)"
    if experts_activation(module) is None:
        act = type(getattr(module, "act_fn", None)).__name__
        return f"{type(module).__name__}'s activation {act} (needs SiLU or tanh GELU)"
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return f"{type(module).__name__} has no 3-D gate_up_proj and down_proj tensors"
    try:
        packed = PackedExperts(gate_up.detach(), down.detach())
    except UnsupportedConfigError as exc:
        return f"{type(module).__name__}: {exc}"
    count = getattr(module, "num_experts", packed.num_experts)
    if count != packed.num_experts:
        return f"{type(module).__name__} says num_experts = {count} but holds {packed.num_experts}"
    return None


_REFERENCE = FusedOps()

_PACKED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.Tensor, torch.Tensor, FusedOps, PackedExperts]] = (
    weakref.WeakKeyDictionary()
)
"""Each routed module's experts: its parameters and the ops when packed (a replaced parameter or another backend
packs again) and what the ops packed."""
_PREVIOUS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
"""Each experts module's implementation before its config switched to this one: what runs outside an engine step
(by module: transformers' configs are not hashable)."""
_state = threading.local()


def pack_experts_for(ops: FusedOps, gate_up: ExpertWeight, down: ExpertWeight) -> PackedExperts:
    """``ops.pack_experts`` for dense weights or formats ``ops`` declares in ``moe_formats``; the reference's
    packing otherwise (its :class:`PackedExperts` reaches the backend's ``experts``, which hands it on)."""
    formats = type(ops).moe_formats
    if any(isinstance(w, QuantizedWeight) and w.format.name not in formats for w in (gate_up, down)):
        return _REFERENCE.pack_experts(gate_up, down)
    return ops.pack_experts(gate_up, down)


def packed_experts(module: torch.nn.Module, ops: FusedOps | None = None) -> PackedExperts:
    """``module``'s experts packed by ``ops`` (the reference's when ``None``: views of its parameters), made once
    per module and ops."""
    ops = _REFERENCE if ops is None else ops
    gate_up: torch.Tensor = module.gate_up_proj  # type: ignore[assignment]
    down: torch.Tensor = module.down_proj  # type: ignore[assignment]
    entry = _PACKED.get(module)
    if entry is None or entry[0] is not gate_up or entry[1] is not down or entry[2] is not ops:
        entry = (gate_up, down, ops, pack_experts_for(ops, gate_up.detach(), down.detach()))
        _PACKED[module] = entry
    return entry[3]


def step_ops() -> FusedOps | None:
    """The backend's ops of the engine step running on this thread (:func:`experts_step`), ``None`` outside one."""
    ops: FusedOps | None = getattr(_state, "ops", None)
    return ops


def _interface(module: torch.nn.Module) -> Any:
    """The experts-function registry the module's class dispatches through (its decorator's closure)."""
    for cell in getattr(type(module).forward, "__closure__", None) or ():
        value = cell.cell_contents
        if type(value).__name__.endswith("ExpertsInterface"):
            return value
    return None


def paged_experts_forward(
    module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The registered experts function: the backend's ``experts`` inside an engine step, the model's previous
    implementation otherwise (and for modules the contract does not serve)."""
    ops = step_ops()
    if ops is not None and module in _PACKED:
        act = experts_activation(module)
        assert act is not None  # checked when the module was routed
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        k = top_k_index.shape[-1]
        packed = packed_experts(module, ops)
        out = ops.experts(x, top_k_weights.reshape(x.shape[0], k), top_k_index.reshape(x.shape[0], k), packed, act)
        return out.view_as(hidden_states)
    return _previous(module)(module, hidden_states, top_k_index, top_k_weights)


def _previous(module: torch.nn.Module) -> Callable[..., torch.Tensor]:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    original = type(module).forward.__wrapped__  # type: ignore[attr-defined]  # the class's own loop
    previous = _PREVIOUS.get(module, "eager")
    fn: Callable[..., torch.Tensor] = ALL_EXPERTS_FUNCTIONS.get_interface(previous, original)
    return fn


_registered = False


def register_paged_experts() -> str:
    """Register :func:`paged_experts_forward` with transformers (idempotent); returns the implementation name."""
    global _registered
    if not _registered:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, paged_experts_forward)
        _registered = True
    return EXPERTS_IMPLEMENTATION


@dataclass(frozen=True)
class RoutedExperts:
    """What :func:`route_model_experts` did to a model's experts modules (by module name)."""

    routed: tuple[str, ...] = ()
    """Modules that run the backend's ``experts`` inside engine steps."""
    kept: dict[str, str] = field(default_factory=dict)
    """Modules that keep transformers' implementation, with the reason."""


def route_model_experts(model: Any, ops: FusedOps | None = None) -> RoutedExperts:
    """Route ``model``'s experts modules through :func:`paged_experts_forward` where the contract serves them, each
    packed by ``ops`` (the backend's; the reference's when ``None``) now, at load.

    Every module sharing a config must dispatch through transformers' own registry for that config to switch (a
    quantizer's registry does not know the name); a module the contract does not serve under a switched config
    runs the previous implementation. Idempotent.
    """
    modules = experts_modules(model)
    if not modules:
        return RoutedExperts()
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    name = register_paged_experts()
    kept: dict[str, str] = {}
    by_config: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for mod_name, module in modules:
        by_config.setdefault(id(module.config), []).append((mod_name, module))
    for group in by_config.values():
        config: Any = group[0][1].config
        foreign = [n for n, m in group if _interface(m) is not ALL_EXPERTS_FUNCTIONS]
        if foreign:
            kept.update({n: "its class dispatches through another experts registry" for n, _ in group})
            continue
        routed = 0
        for mod_name, module in group:
            reason = experts_refusal(module)
            if reason is None:
                packed_experts(module, ops)
                routed += 1
            else:
                _PACKED.pop(module, None)
                kept[mod_name] = reason
        if routed and config._experts_implementation != name:
            for _, module in group:
                _PREVIOUS[module] = config._experts_implementation or "eager"
            config._experts_implementation = name
    if kept:
        first = next(iter(kept.items()))
        log.info("experts: %d of %d modules keep transformers' own (%s: %s)", len(kept), len(modules), *first)
    return RoutedExperts(tuple(n for n, _ in modules if n not in kept), kept)


@contextmanager
def experts_step(ops: FusedOps | None = None) -> Iterator[None]:
    """Inside, routed experts modules run ``ops.experts`` (the reference's when ``None``): an engine step; outside,
    their previous implementation."""
    before = getattr(_state, "ops", None)
    _state.ops = _REFERENCE if ops is None else ops
    try:
        yield
    finally:
        _state.ops = before
