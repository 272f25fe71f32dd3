"""Routed experts (mixture of experts): the routing rule, the experts' weights, and the reference op.

A MoE layer sends each token to ``top_k`` of ``num_experts`` gated MLPs ("experts") chosen by a router, and
sums their outputs weighted by the router's scores. :class:`MoERouting` says how a model family turns the
router's logits ``[T, E]`` into each token's expert ids and weights (:func:`route_experts`, the rule every
backend follows unless it overrides the whole op), :class:`PackedExperts` holds the experts' weights as a
backend keeps them, and :func:`reference_moe` is the reference arithmetic of
:meth:`FusedOps.moe <paged_core.contract.fused_ops.FusedOps.moe>`.

How the families of transformers map (``transformers/models/*/modeling_*.py``, their ``*TopKRouter``):

==============================  =====================================================================
family                          routing
==============================  =====================================================================
Mixtral                         ``softmax``, ``renormalize=True`` (softmax over all experts, top-k, the
                                ``k`` weights divided by their sum: the softmax over the top-k logits)
Qwen3-MoE                       ``softmax``, ``renormalize=config.norm_topk_prob``
Qwen2-MoE, OLMoE                ``softmax``, ``renormalize=config.norm_topk_prob`` (False in their
                                checkpoints); Qwen2-MoE's shared expert is a dense MLP outside this op
sigmoid routers (DeepSeek-V3)   ``sigmoid``, ``renormalize`` and ``routed_scaling`` from the config
                                (its group-limited selection and score-correction bias are not covered)
==============================  =====================================================================

Expert weights follow transformers' ``*Experts`` modules: ``gate_up_proj`` ``[E, 2I, H]`` (per expert the
``I`` gate rows, then the ``I`` up rows) and ``down_proj`` ``[E, H, I]``; expert ``e`` computes
``down[e] @ (act(gate[e] @ x) * (up[e] @ x))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from paged_core.errors import UnsupportedConfigError
from paged_core.quant import QuantizedWeight, dequantize

Scoring = Literal["softmax", "sigmoid"]
Activation = Literal["silu", "gelu_tanh"]
ExpertWeight = torch.Tensor | QuantizedWeight
"""One stacked expert weight: a dense 3-D tensor, or a :class:`~paged_core.quant.QuantizedWeight` of ``E * N``
rows (see :class:`PackedExperts`)."""

SCORINGS: tuple[str, ...] = get_args(Scoring)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)

_ACTIVATION_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}


@dataclass(frozen=True)
class MoERouting:
    """How a MoE layer routes: ``scoring`` of the router's logits, ``top_k`` experts per token, their weights.

    For each token, in float32: ``scores = softmax(logits)`` over all ``num_experts`` (or ``sigmoid(logits)``
    elementwise); the experts of the ``top_k`` largest logits are chosen (those of the largest scores: both
    scorings are increasing), largest first, an exact tie going to the lower expert id; their scores are the
    weights, divided by their sum with ``renormalize``, then multiplied by ``routed_scaling``. Each chosen
    expert computes ``down(act(gate) * up)`` with the gated ``activation`` (``silu``:
    :func:`torch.nn.functional.silu`; ``gelu_tanh``: GELU's tanh approximation).

    ``renormalize`` has no default (families differ; see the module table) and is keyword-only. Invalid
    values raise :class:`~paged_core.errors.UnsupportedConfigError` naming the field.
    """

    num_experts: int
    top_k: int
    scoring: Scoring = "softmax"
    renormalize: bool = field(kw_only=True)
    activation: Activation = "silu"
    routed_scaling: float = 1.0

    def __post_init__(self) -> None:
        def refuse(name: str, why: str) -> UnsupportedConfigError:
            return UnsupportedConfigError(f"MoERouting.{name} = {getattr(self, name)!r}: {why}")

        if not _is_int(self.num_experts) or self.num_experts < 1:
            raise refuse("num_experts", "must be a positive int")
        if not _is_int(self.top_k) or not 1 <= self.top_k <= self.num_experts:
            raise refuse("top_k", f"must be an int between 1 and num_experts = {self.num_experts}")
        if self.scoring not in SCORINGS:
            raise refuse("scoring", f"must be one of {', '.join(SCORINGS)}")
        if not isinstance(self.renormalize, bool):
            raise refuse("renormalize", "must be True or False")
        if self.activation not in ACTIVATIONS:
            raise refuse("activation", f"must be one of {', '.join(ACTIVATIONS)}")
        scaling = self.routed_scaling
        if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not math.isfinite(scaling):
            raise refuse("routed_scaling", "must be a finite number")
        if scaling <= 0:
            raise refuse("routed_scaling", "must be positive")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def route_experts(router_logits: torch.Tensor, routing: MoERouting) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts and weights: ``(weights [T, k] float32, ids [T, k] int32)``, largest weight first.

    ``router_logits`` ``[T, E]`` in any float dtype (the router's product in the model's dtype); the rule is
    :class:`MoERouting`'s, computed in float32. The weights are the scores transformers' routers compute
    (``softmax`` of the float32 logits, the chosen ones divided by their sum), so an fp32 model's weights are
    those bits. Two differences, both deliberate: the choice is made on the logits with ties to the lower
    expert id (``torch.topk`` of the scores leaves the order of equal scores to the kernel, and rounding can
    make distinct logits equal scores: a kernel computing its scores another way would choose otherwise),
    and the weights stay float32 (Qwen2/Qwen3-MoE and OLMoE round them to the logits' dtype).
    """
    if router_logits.dim() != 2 or router_logits.shape[1] != routing.num_experts:
        raise UnsupportedConfigError(
            f"router_logits {tuple(router_logits.shape)}: the routing needs [T, {routing.num_experts}] "
            f"(num_experts = {routing.num_experts})"
        )
    logits = router_logits.float()
    # A stable descending sort keeps equal logits in expert order, which torch.topk does not promise.
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, : routing.top_k]
    scores = logits.softmax(dim=-1) if routing.scoring == "softmax" else logits.sigmoid()
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routing.routed_scaling != 1.0:
        weights = weights * routing.routed_scaling
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def _shape(w: ExpertWeight) -> tuple[int, ...]:
    return tuple(w.shape)


def _describe(name: str, w: ExpertWeight) -> str:
    if isinstance(w, QuantizedWeight):
        return f"{name} {w.format.name} rows x in {w.shape}"
    return f"{name} {tuple(w.shape)}"


@dataclass
class PackedExperts:
    """The routed experts of one MoE layer in the form a backend's :meth:`FusedOps.moe` reads.

    ``gate_up`` holds every expert's merged gate and up projections and ``down`` its down projection, each
    either dense or packed:

    * dense: ``gate_up`` ``[E, 2I, H]`` (per expert the ``I`` gate rows, then the ``I`` up rows, as
      transformers' ``gate_up_proj``) and ``down`` ``[E, H, I]``, any float dtype;
    * packed: a :class:`~paged_core.quant.QuantizedWeight` of the experts' rows stacked, expert ``e`` owning
      rows ``e * N .. (e + 1) * N``: ``gate_up`` of shape ``(E * 2I, H)`` (expert ``e``'s gate rows, then its
      up rows) and ``down`` of shape ``(E * H, I)``. That is a GGUF 3-D expert tensor's bytes as they are
      (``ffn_down_exps``, ``[E, H, I]`` row-major, is ``E * H`` packed rows): no copy. GGUF keeps the gate
      and up tensors apart (``ffn_gate_exps``, ``ffn_up_exps``); :func:`merge_gate_up` interleaves them per
      expert, once at load.

    The two may differ in kind (a GGUF ``Q4_K_M`` file has ``q4_k`` gate/up and ``q6_k`` down). ``packed`` is
    whatever the backend made of them at load (``None`` for the reference). Construction checks that the
    two describe the same ``E``, ``H`` and ``I`` and raises
    :class:`~paged_core.errors.UnsupportedConfigError` naming both shapes when they do not.
    """

    gate_up: ExpertWeight
    down: ExpertWeight
    packed: Any = None

    def __post_init__(self) -> None:
        self._dims = _expert_dims(self.gate_up, self.down)

    @property
    def num_experts(self) -> int:
        """``E``."""
        return self._dims[0]

    @property
    def hidden_size(self) -> int:
        """``H``: the size of a token's hidden state, in and out."""
        return self._dims[1]

    @property
    def intermediate_size(self) -> int:
        """``I``: each expert's intermediate size (``gate_up`` has ``2I`` rows per expert)."""
        return self._dims[2]

    @property
    def kinds(self) -> tuple[str, str]:
        """The weight kinds of ``(gate_up, down)``: a packed format's name or a dense dtype's (``"q4_k"``,
        ``"bfloat16"``), as :attr:`FusedOps.moe_formats` and :attr:`FusedOps.batch_invariant_moe` name them."""
        return _kind(self.gate_up), _kind(self.down)

    def expert(self, e: int) -> tuple[ExpertWeight, ExpertWeight]:
        """Expert ``e``'s ``gate_up`` ``[2I, H]`` and ``down`` ``[H, I]``: views, packed rows as packed rows."""
        if not 0 <= e < self.num_experts:
            raise IndexError(f"expert {e} of {self.num_experts}")
        i2, h = 2 * self.intermediate_size, self.hidden_size
        gu, dn = self.gate_up, self.down
        gate_up = gu.rows(e * i2, (e + 1) * i2) if isinstance(gu, QuantizedWeight) else gu[e]
        down = dn.rows(e * h, (e + 1) * h) if isinstance(dn, QuantizedWeight) else dn[e]
        return gate_up, down

    def check_routing(self, routing: MoERouting) -> None:
        """Raise :class:`~paged_core.errors.UnsupportedConfigError` unless ``routing`` routes over these experts."""
        if routing.num_experts != self.num_experts:
            raise UnsupportedConfigError(
                f"experts ({_describe('gate_up', self.gate_up)}, {_describe('down', self.down)}) hold "
                f"{self.num_experts} experts; the routing has num_experts = {routing.num_experts}"
            )


def _kind(w: ExpertWeight) -> str:
    return w.format.name if isinstance(w, QuantizedWeight) else str(w.dtype).removeprefix("torch.")


def _expert_dims(gate_up: ExpertWeight, down: ExpertWeight) -> tuple[int, int, int]:
    """``(E, H, I)`` of a layer's experts, or the :class:`UnsupportedConfigError` naming why they do not fit."""
    what = f"{_describe('gate_up', gate_up)} and {_describe('down', down)}"

    def refuse(why: str) -> UnsupportedConfigError:
        return UnsupportedConfigError(
            f"expert weights {what}: {why} (dense gate_up [E, 2I, H] and down [E, H, I], or QuantizedWeights of "
            "(E * 2I, H) and (E * H, I) rows)"
        )

    for name, w in (("gate_up", gate_up), ("down", down)):
        if isinstance(w, QuantizedWeight):
            continue
        if not isinstance(w, torch.Tensor):
            raise refuse(f"{name} is a {type(w).__name__}, not a tensor or a QuantizedWeight")
        if w.dim() != 3 or not w.is_floating_point():
            raise refuse(f"a dense {name} must be a 3-D floating-point tensor, got {w.dim()}-D {w.dtype}")
        if w.numel() == 0:
            raise refuse(f"{name} is empty")
    hidden, inter = _shape(gate_up)[-1], _shape(down)[-1]
    dense_rows = _shape(gate_up)[1] if not isinstance(gate_up, QuantizedWeight) else None
    if dense_rows is not None and dense_rows % 2:
        raise refuse(f"2I = {dense_rows} is odd (gate and up need I rows each)")

    def experts(w: ExpertWeight, rows_per_expert: int, name: str) -> int:
        if isinstance(w, QuantizedWeight):
            if w.out_features % rows_per_expert:
                raise refuse(f"{name}'s {w.out_features} rows are no multiple of {rows_per_expert}")
            return w.out_features // rows_per_expert
        if w.shape[1] != rows_per_expert:
            raise refuse(f"{name} has {w.shape[1]} rows per expert, {rows_per_expert} expected")
        return int(w.shape[0])

    e_down = experts(down, hidden, "down")  # H: gate_up's input size is down's output size
    e_gate_up = experts(gate_up, 2 * inter, "gate_up")  # I: down's input size
    if e_down != e_gate_up:
        raise refuse(f"gate_up holds {e_gate_up} experts, down {e_down}")
    return e_down, hidden, inter


def merge_gate_up(gate: ExpertWeight, up: ExpertWeight, num_experts: int) -> ExpertWeight:
    """The ``gate_up`` of :class:`PackedExperts` from separate stacked gate and up weights (GGUF's
    ``ffn_gate_exps`` and ``ffn_up_exps``): dense ``[E, I, H]`` each, or packed ``(E * I, H)`` each of one
    format. Expert ``e``'s gate rows, then its up rows; packed bytes are moved, never re-encoded (one copy)."""
    if isinstance(gate, QuantizedWeight) and isinstance(up, QuantizedWeight):
        if gate.format != up.format or gate.shape != up.shape or gate.out_features % num_experts:
            raise UnsupportedConfigError(
                f"cannot merge {_describe('gate', gate)} with {_describe('up', up)} over {num_experts} experts"
            )
        rows = gate.out_features // num_experts

        def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            per = (num_experts, rows, *a.shape[1:])
            return torch.cat((a.reshape(per), b.reshape(per)), dim=1).reshape(2 * a.shape[0], *a.shape[1:])

        scale = None
        if gate.scale is not None and up.scale is not None:
            scale = interleave(gate.scale, up.scale)
        data = interleave(gate.data, up.data)
        return QuantizedWeight(gate.format, (2 * gate.out_features, gate.in_features), data, scale, gate.name)
    if isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor) and gate.shape == up.shape:
        if gate.dim() == 3 and gate.shape[0] == num_experts:
            return torch.cat((gate, up), dim=1)
    raise UnsupportedConfigError(
        f"cannot merge {_describe('gate', gate)} with {_describe('up', up)} over {num_experts} experts"
    )


def stack_experts(weights: Sequence[ExpertWeight]) -> ExpertWeight:
    """One stacked weight from per-expert 2-D ones (checkpoints with a tensor per expert): dense ``[N, K]`` each
    gives ``[E, N, K]``; packed ones of one format give ``(E * N, K)`` rows (a view when they are consecutive
    rows of one buffer already)."""
    if all(isinstance(w, QuantizedWeight) for w in weights):
        return QuantizedWeight.cat([w for w in weights if isinstance(w, QuantizedWeight)])
    if all(isinstance(w, torch.Tensor) for w in weights):
        return torch.stack([w for w in weights if isinstance(w, torch.Tensor)])
    raise UnsupportedConfigError("cannot stack dense and packed expert weights together")


def _dense(w: ExpertWeight) -> torch.Tensor:
    """One expert's weight in float32 (a packed one dequantized exactly)."""
    return dequantize(w) if isinstance(w, QuantizedWeight) else w.float()


def check_moe_inputs(x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting) -> None:
    """Raise :class:`~paged_core.errors.UnsupportedConfigError` naming the shapes unless ``x`` ``[T, H]``,
    ``router_logits`` ``[T, E]``, ``experts`` and ``routing`` agree."""
    experts.check_routing(routing)
    t = x.shape[0] if x.dim() == 2 else -1
    if x.dim() != 2 or x.shape[1] != experts.hidden_size:
        raise UnsupportedConfigError(f"moe x {tuple(x.shape)}: the experts need [T, {experts.hidden_size}]")
    if tuple(router_logits.shape) != (t, routing.num_experts):
        raise UnsupportedConfigError(
            f"moe router_logits {tuple(router_logits.shape)}: x {tuple(x.shape)} and {routing.num_experts} "
            f"experts need ({t}, {routing.num_experts})"
        )


def check_experts_inputs(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts) -> None:
    """Raise :class:`~paged_core.errors.UnsupportedConfigError` naming the shapes unless ``x`` ``[T, H]``, ``weights``
    and ``ids`` ``[T, k]`` (floats and integers) fit ``experts``: ``FusedOps.experts``' refusals (the ids' range is
    not checked: that reads them on the host)."""
    tokens, hidden = x.shape[0] if x.dim() == 2 else -1, experts.hidden_size
    if x.dim() != 2 or x.shape[1] != hidden:
        raise UnsupportedConfigError(f"experts x {tuple(x.shape)}: the experts need [T, {hidden}]")
    if ids.dim() != 2 or ids.shape[0] != tokens or tuple(weights.shape) != tuple(ids.shape):
        raise UnsupportedConfigError(
            f"experts weights {tuple(weights.shape)} and ids {tuple(ids.shape)}: x {tuple(x.shape)} needs both "
            f"[{tokens}, k]"
        )
    if ids.is_floating_point() or not weights.is_floating_point():
        raise UnsupportedConfigError(
            f"experts ids must be integers and weights floats, got {ids.dtype}, {weights.dtype}"
        )


def reference_moe(
    x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
) -> torch.Tensor:
    """:meth:`FusedOps.moe <paged_core.contract.fused_ops.FusedOps.moe>`'s reference arithmetic (see there).

    Routes with :func:`route_experts`; sorts the ``T * k`` (token, slot) pairs by expert id (stable: in token
    order within an expert); for each expert that has tokens, in float32: ``gate_up`` product, ``act(gate) *
    up``, ``down`` product (a packed expert dequantized exactly); then each token's ``k`` outputs times their
    weights, summed in slot order in float32, rounded once to ``x.dtype``. Reads the per-expert token counts
    on the host (eager steps only, like the reference LoRA ops).
    """
    check_moe_inputs(x, router_logits, experts, routing)
    weights, ids = route_experts(router_logits, routing)
    return apply_experts(x, weights, ids, experts, routing.activation)


def apply_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: PackedExperts,
    activation: Activation = "silu",
) -> torch.Tensor:
    """The experts half of :func:`reference_moe`, for a routing computed elsewhere: ``[T, H]`` in ``x.dtype``.

    ``x`` ``[T, H]``; ``weights`` ``[T, k]`` (any float dtype, read in float32) and ``ids`` ``[T, k]`` (any
    integer dtype, each in ``0 .. E - 1``) are each token's experts and weights, as :func:`route_experts`
    gives them or a model's own router computed them (transformers' ``*Experts`` modules receive
    ``top_k_index`` and ``top_k_weights``: the engine's transformers path calls this, see
    :mod:`paged_core.runner.experts`). The arithmetic is :func:`reference_moe`'s: the ``T * k`` pairs grouped
    by expert (stable), each expert that has tokens in float32, each token's ``k`` outputs times their weights
    summed in slot order in float32, rounded once. Refuses (:class:`~paged_core.errors.UnsupportedConfigError`)
    shapes that do not fit and ids outside the experts; reads the per-expert counts on the host.
    """
    check_experts_inputs(x, weights, ids, experts)
    tokens, hidden = x.shape[0], experts.hidden_size
    k, inter = ids.shape[1], experts.intermediate_size
    if k == 0:
        return torch.zeros_like(x)
    act = _ACTIVATION_FNS[activation]
    flat = ids.reshape(-1).long()
    if flat.numel():
        lo, hi = torch.stack(torch.aminmax(flat)).tolist()
        if lo < 0 or hi >= experts.num_experts:
            raise UnsupportedConfigError(
                f"experts ids range over {lo} .. {hi}; the experts are 0 .. {experts.num_experts - 1}"
            )
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
    outs = torch.empty(tokens * k, hidden, dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start : start + n]
        start += n
        gate_up, down = experts.expert(e)
        h = torch.nn.functional.linear(x.index_select(0, pairs // k).float(), _dense(gate_up))
        outs.index_copy_(0, pairs, torch.nn.functional.linear(act(h[:, :inter]) * h[:, inter:], _dense(down)))
    per_slot = outs.view(tokens, k, hidden)
    w = weights.float()
    acc = per_slot[:, 0] * w[:, 0:1]
    for j in range(1, k):
        acc = acc + per_slot[:, j] * w[:, j : j + 1]
    return acc.to(x.dtype)
