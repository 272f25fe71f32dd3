"""Whether a running configuration is batch-invariant, and which parts are not (DESIGN.md, "Batch invariance").

A configuration is batch-invariant when a request's logits, and so its greedy tokens, do not depend on
what it is batched with: not on the number of rows of its steps, chunked prefill, prefix-cache hits or
speculative verify rows. That holds when every part of the forward reduces each row in an order its own
shapes fix, which :func:`batch_invariance` reads from what the backend declares and the conformance suite
proves bit for bit:

* attention: ``BackendCapabilities.batch_invariant``, over whatever KV cache dtype runs (``kv_cache_dtype``): a
  quantized cache (int8, fp8) stays invariant, since each vector's scale is its own (per token-head), so what
  is stored for a token depends on that token alone, and the suite checks reading it back the same way;
* the layer ops of the fused decoder (norms, activation, rotary, and the head rotation of quantized KV caches):
  ``FusedOps.batch_invariant_layer_ops``;
* each kind of linear weight the model holds (packed format or dense dtype, the LM head included):
  ``FusedOps.batch_invariant_linear``.

And of the way steps run, only what is proven counts: the fused decoder (transformers' modules run
torch's own layers), eager steps (``compiled`` lets inductor generate the layer ops' kernels, and
replayed device graphs are compared with eager steps within a tolerance, not bit for bit: neither is
proven) and one rank (a tensor-parallel all-reduce's summation order is the collective library's).
Embedding lookups, slicing and concatenation between the parts move values without arithmetic.

The report covers the model's logits. Sampling works row by row: greedy is an argmax, a row's probabilities
(temperature, top-k, top-p, min-p) have the same bits in any batch (core/tests/sampling/test_seeding.py),
and a request with a seed draws from a generator of its own; requests without a seed share the engine's
generator, so their draws depend on the order requests arrive in by design.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from paged_core.contract.capabilities import BackendCapabilities
from paged_core.contract.fused_ops import FusedOps, linear_kind
from paged_core.errors import UnsupportedConfigError
from paged_core.quant.formats import FORMATS
from paged_core.runner.packed_experts import PackedExpertsModule
from paged_core.runner.packed_linear import PackedLinearModule

PROVEN_MODEL_PATHS = ("fused",)
"""Model paths whose every part is a declared op (:mod:`paged_core.runner.forward`)."""
PROVEN_GRAPH_MODES = ("eager",)
"""Graph modes that run exactly the declared ops (:mod:`paged_core.runner.executors`)."""


@dataclass(frozen=True)
class VariantPart:
    """One part of a configuration that is not batch-invariant: what it is (``"linear q8_0"``) and why."""

    part: str
    reason: str

    def __str__(self) -> str:
        return f"{self.part}: {self.reason}"


@dataclass(frozen=True)
class BatchInvariance:
    """The report on one running configuration: invariant when no part is ``variant``."""

    variant: tuple[VariantPart, ...]
    """Every part that is not batch-invariant (none: the configuration is)."""
    parts: tuple[str, ...] = ()
    """What was checked, for the log: the backend, the ops and the linear kinds with their layer counts."""

    @property
    def invariant(self) -> bool:
        return not self.variant

    def reasons(self) -> list[str]:
        """``"part: reason"`` for each variant part."""
        return [str(p) for p in self.variant]

    def describe(self) -> str:
        """One line for the engine's start-up log."""
        if self.invariant:
            return f"batch-invariant: yes ({'; '.join(self.parts)})"
        return f"batch-invariant: no ({'; '.join(self.reasons())})"

    def require(self) -> None:
        """Refuse (``--batch-invariant``) with :class:`UnsupportedConfigError` naming every variant part."""
        if not self.invariant:
            raise UnsupportedConfigError(
                "--batch-invariant refused: this configuration is not batch-invariant: " + "; ".join(self.reasons())
            )


def model_linear_kinds(model: torch.nn.Module) -> Counter[str]:
    """How many linear layers of ``model`` hold each weight kind (:func:`~paged_core.contract.fused_ops.linear_kind`:
    a packed format or a dense dtype), the LM head included (a tied one is the embedding's dense weight)."""
    kinds: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, PackedLinearModule):
            kinds[linear_kind(module.qweight)] += 1
        elif isinstance(module, torch.nn.Linear):
            kinds[linear_kind(module.weight)] += 1
    return kinds


def model_expert_kinds(model: torch.nn.Module) -> Counter[tuple[str, str]]:
    """How many routed-experts layers of ``model`` hold each ``(gate_up, down)`` weight-kind pair: packed experts
    (:class:`~paged_core.runner.packed_experts.PackedExpertsModule`) by their formats, transformers' experts
    modules (3-D ``gate_up_proj`` and ``down_proj`` parameters) by their dtypes."""
    kinds: Counter[tuple[str, str]] = Counter()
    for module in model.modules():
        if isinstance(module, PackedExpertsModule):
            kinds[module.weights.kinds] += 1
            continue
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == down.dim() == 3:
            kinds[(linear_kind(gate_up), linear_kind(down))] += 1
    return kinds


def _names(ops: FusedOps, attribute: str) -> frozenset[str]:
    declared: object = getattr(type(ops), attribute, frozenset())
    # A declaration that is no collection of names declares nothing (the conformance suite fails it).
    return frozenset(str(k) for k in declared) if isinstance(declared, (set, frozenset, list, tuple)) else frozenset()


def _declared_kinds(ops: FusedOps) -> frozenset[str]:
    return _names(ops, "batch_invariant_linear")


def batch_invariance(
    capabilities: BackendCapabilities,
    ops: FusedOps,
    linear_kinds: Counter[str] | Iterable[str],
    *,
    backend: str,
    model_path: str = "fused",
    graph_mode: str = "eager",
    tensor_parallel_size: int = 1,
    expert_kinds: Counter[tuple[str, str]] | None = None,
) -> BatchInvariance:
    """Whether a configuration is batch-invariant (see the module), naming each part that is not and why.

    ``capabilities`` and ``ops`` are the backend's (``backend`` its name); ``linear_kinds`` the kinds of the
    model's linear weights (:func:`model_linear_kinds`, or any iterable of kinds); ``model_path`` the
    resolved model path (``fused`` or ``transformers``), ``graph_mode`` the resolved one (``eager``,
    ``compiled``, ``device``); ``expert_kinds`` the ``(gate_up, down)`` kinds of its routed-experts layers
    (:func:`model_expert_kinds`), each invariant when both kinds are in ``FusedOps.batch_invariant_moe``.
    Anything not proven counts as not invariant.
    """
    kinds = linear_kinds if isinstance(linear_kinds, Counter) else Counter(linear_kinds)
    cls = type(ops)
    who = f"{getattr(ops, 'name', cls.__name__)} FusedOps ({cls.__module__}.{cls.__qualname__})"
    variant: list[VariantPart] = []
    if model_path not in PROVEN_MODEL_PATHS:
        variant.append(
            VariantPart(
                f"model_impl {model_path}",
                "runs transformers' own layers (torch's matmuls, "
                "norms and activations choose kernels by the batch's size)",
            )
        )
    if capabilities.batch_invariant is not True:
        variant.append(VariantPart("attention", f"backend {backend!r} does not declare batch_invariant"))
    if model_path in PROVEN_MODEL_PATHS and getattr(cls, "batch_invariant_layer_ops", False) is not True:
        variant.append(
            VariantPart(
                "layer ops",
                f"{who} do not declare batch_invariant_layer_ops (rms_norm, add_rms_norm, silu_and_mul, rotary, "
                "rotate_heads)",
            )
        )
    declared = _declared_kinds(ops)
    own: object = getattr(cls, "linear_formats", frozenset())
    formats = frozenset(own) if isinstance(own, (set, frozenset, list, tuple)) else frozenset()
    for kind in sorted(kinds):
        if kind not in declared:
            layers = f"{kinds[kind]} layer{'s' if kinds[kind] != 1 else ''}"
            route = f", packed by the reference (not one of {who}'s)" if kind in FORMATS and kind not in formats else ""
            variant.append(
                VariantPart(f"linear {kind} ({layers})", f"{who} do not declare it in batch_invariant_linear{route}")
            )
    experts = expert_kinds or Counter()
    moe_declared = _names(ops, "batch_invariant_moe")
    for pair in sorted(experts):
        if not set(pair) <= moe_declared:
            layers = f"{experts[pair]} layer{'s' if experts[pair] != 1 else ''}"
            variant.append(
                VariantPart(
                    f"routed experts {pair[0]}/{pair[1]} ({layers})", f"{who} do not declare it in batch_invariant_moe"
                )
            )
    if graph_mode not in PROVEN_GRAPH_MODES:
        why = {
            "compiled": "torch.compile (inductor) generates the kernels of the ops around the backend's; not "
            "proven batch-invariant",
            "device": "replayed device graphs are checked against eager steps within a tolerance, not bit for bit",
        }.get(graph_mode, "not proven batch-invariant")
        variant.append(VariantPart(f"graph_mode {graph_mode}", why))
    if tensor_parallel_size != 1:
        variant.append(
            VariantPart(
                f"tensor_parallel_size {tensor_parallel_size}",
                "the all-reduce of partial sums "
                "across ranks sums in the collective library's order, not proven "
                "batch-invariant",
            )
        )
    linear = ", ".join(f"{k} x{kinds[k]}" for k in sorted(kinds)) or "none"
    parts = (
        f"attention of backend {backend!r}",
        f"{model_path} model path on {who}",
        f"linear {linear}",
        *([f"routed experts {', '.join(f'{g}/{d} x{n}' for (g, d), n in sorted(experts.items()))}"] if experts else []),
        f"graph_mode {graph_mode}",
    )
    return BatchInvariance(tuple(variant), parts)
