"""Rooflines: the work a run had to do, against the ceilings measured on the same machine.

``throughput`` counts FLOPs: every token computed passes through the body's
weights (2 FLOPs per parameter), every sampled token through the LM head,
and attention costs ``4 x heads x head_dim`` per layer per token of context
(QK^T and PV). Prefix-cache hits are not computed, so they are not counted;
recompute after preemption is real work but not counted either (the
fraction can only be understated). ``decode-1`` counts bytes: one decode
step reads every weight once.

A mixture-of-experts model routes each token through ``top_k`` of each MoE
layer's ``E`` experts, so a token passes through (and a decode step reads)
the non-expert weights plus ``top_k / E`` of each layer's expert weights,
in the form they are stored (packed GGUF experts: their packed bytes). Both
counts use those active weights; the report keeps the totals beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MoEShape:
    """A model's routed experts: totals over its MoE layers, and what one token passes through."""

    num_layers: int
    """Layers with routed experts (a model may keep some layers dense)."""
    num_experts: int
    top_k: int
    params: int
    """Expert weights' elements, every expert of every MoE layer (part of ``ModelShape.body_params``)."""
    active_params: int
    """Of those, the ``top_k / E`` share of each layer one token is routed through."""
    bytes: int
    """Expert weights' bytes as stored (packed bytes for packed experts)."""
    active_bytes: int
    """Of those, the ``top_k / E`` share of each layer one decode token reads."""
    modules: tuple[str, ...]
    """The experts modules' class names (which implementation transformers' own forward runs)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "expert_params": self.params,
            "active_expert_params": self.active_params,
            "expert_bytes": self.bytes,
            "active_expert_bytes_per_token": self.active_bytes,
            "experts_modules": list(self.modules),
        }


def _experts(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int, int, int]]:
    """``(module, experts, elements, bytes)`` of each routed-experts module: paged's packed ones and transformers'
    (3-D parameters, one slice per expert)."""
    from paged_core.runner.experts import experts_modules
    from paged_core.runner.packed_experts import PackedExpertsModule, packed_expert_bytes, packed_experts_modules

    out: list[tuple[torch.nn.Module, int, int, int]] = []
    for _, packed in packed_experts_modules(model):
        numel = packed.num_experts * 3 * packed.hidden_dim * packed.intermediate_dim  # gate, up and down per expert
        out.append((packed, packed.num_experts, numel, packed_expert_bytes(packed)))
    for _, m in experts_modules(model):
        if isinstance(m, PackedExpertsModule):
            continue
        params = list(m.parameters())
        numel = sum(p.numel() for p in params)
        experts = int(getattr(m, "num_experts"))  # noqa: B009 (Module.__getattr__ is typed Tensor | Module)
        out.append((m, experts, numel, sum(p.numel() * p.element_size() for p in params)))
    return out


def moe_shape(model: torch.nn.Module) -> MoEShape | None:
    """The routed experts of ``model`` (``None`` when it has none); ``top_k`` is the config's
    ``num_experts_per_tok``."""
    found = _experts(model)
    if not found:
        return None
    cfg = model.config.get_text_config()  # type: ignore[operator, union-attr]
    top_k = int(cfg.num_experts_per_tok)
    experts = {e for _, e, _, _ in found}
    # Every expert of a layer has the same shape and format, so a layer's share is exact: its total // E * k.
    return MoEShape(
        num_layers=len(found),
        num_experts=max(experts),
        top_k=top_k,
        params=sum(n for _, _, n, _ in found),
        active_params=sum(n // e * min(top_k, e) for _, e, n, _ in found),
        bytes=sum(b for _, _, _, b in found),
        active_bytes=sum(b // e * min(top_k, e) for _, e, _, b in found),
        modules=tuple(sorted({type(m).__name__ for m, _, _, _ in found})),
    )


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP and byte counts need to know about a model."""

    body_params: int
    """Parameters every computed token passes through (all but the input embedding and the LM head)."""
    head_params: int
    """LM-head parameters: used once per sampled token (logits are computed for those rows only)."""
    num_layers: int
    num_heads: int
    head_dim: int
    element_size: int
    weight_bytes: int | None = None
    """Bytes of every weight of the body and the LM head when some are packed or routed experts
    (``None``: every weight dense, ``element_size``)."""
    moe: MoEShape | None = None
    """The routed experts (``None``: a dense model)."""

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> ModelShape:
        """Read the shape from a transformers causal LM (tied embeddings are counted once, as the head).

        Packed linear layers (:class:`~paged_core.runner.packed_linear.PackedLinearModule`) count their
        weights' elements as parameters and their packed bytes as what a decode step reads; routed experts
        (transformers' experts modules, or packed :class:`~paged_core.runner.packed_experts.PackedExpertsModule`)
        are counted in full and, in :attr:`moe`, by the share one token is routed through.
        """
        from paged_core.runner.packed_experts import packed_expert_bytes, packed_experts_modules
        from paged_core.runner.packed_linear import packed_modules

        params = {id(p): p for p in model.parameters()}
        embed = model.get_input_embeddings().weight  # type: ignore[operator]
        head_module = model.get_output_embeddings()  # type: ignore[operator]
        packed = packed_modules(model)
        head_q = getattr(head_module, "qweight", None)
        head_numel = head_q.out_features * head_q.in_features if head_q is not None else head_module.weight.numel()
        head_is_embed = head_q is None and head_module.weight is embed
        moe = moe_shape(model)
        packed_experts = packed_experts_modules(model)
        dense = sum(p.numel() for p in params.values())
        packed_numel = sum(m.out_features * m.in_features for _, m in packed)
        packed_numel += sum(m.num_experts * 3 * m.hidden_dim * m.intermediate_dim for _, m in packed_experts)
        total = dense + packed_numel
        skip = embed.numel() + (head_numel if not head_is_embed else 0)
        cfg = model.config.get_text_config()  # type: ignore[operator, union-attr]
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        weight_bytes = None
        if packed or moe is not None:  # each tensor as stored; the embedding row a token reads is negligible
            body_dense = sum(p.numel() * p.element_size() for p in params.values() if p is not embed)
            tied_head = embed.numel() * embed.element_size() if head_is_embed else 0
            linears = {(m.qweight.data.data_ptr(), m.qweight.nbytes): m.qweight.nbytes for _, m in packed}
            experts = sum(packed_expert_bytes(m) for _, m in packed_experts)
            weight_bytes = body_dense + tied_head + sum(linears.values()) + experts
        return cls(
            total - skip,
            head_numel,
            int(cfg.num_hidden_layers),
            heads,
            head_dim,
            embed.element_size(),
            weight_bytes,
            moe,
        )

    @property
    def total_weight_bytes(self) -> int:
        """Bytes of every weight of the body and the LM head (all experts; the embedding not counted)."""
        if self.weight_bytes is not None:
            return self.weight_bytes
        return (self.body_params + self.head_params) * self.element_size

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (body and LM head; of routed experts, the ``top_k`` a token
        is sent to in each layer; the embedding row is negligible)."""
        if self.moe is None:
            return self.total_weight_bytes
        return self.total_weight_bytes - self.moe.bytes + self.moe.active_bytes

    @property
    def active_body_params(self) -> int:
        """Body parameters one token passes through (of routed experts, only its ``top_k`` per layer)."""
        if self.moe is None:
            return self.body_params
        return self.body_params - self.moe.params + self.moe.active_params

    def moe_figures(self) -> dict[str, Any] | None:
        """The routed experts' counts and the active-expert share of a decode token's bytes (``None``: dense)."""
        if self.moe is None:
            return None
        return {
            **self.moe.to_dict(),
            "active_expert_share": self.moe.active_bytes / self.weight_bytes_per_token,
        }

    def request_flops(self, num_prompt: int, num_output: int, num_cached: int = 0) -> int:
        """FLOPs to serve one request whose first ``num_cached`` prompt tokens came from the prefix cache."""
        n = num_prompt + num_output - 1  # the last sampled token is never fed back
        c = min(num_cached, n)
        context = (n * (n + 1) - c * (c + 1)) // 2  # token at position p attends to p + 1 positions
        attention = 4 * self.num_layers * self.num_heads * self.head_dim * context
        return 2 * self.active_body_params * (n - c) + 2 * self.head_params * num_output + attention


def flops_roofline(
    shape: ModelShape, requests: Sequence[tuple[int, int, int]], seconds: float, gemm: dict[str, Any]
) -> dict[str, Any]:
    """Achieved FLOP/s of a run against the measured GEMM rate.

    ``requests`` holds ``(prompt tokens, output tokens, cached tokens)`` per
    request; ``gemm`` is :func:`~paged_bench.machine.measure_gemm`'s result.
    """
    flops = sum(shape.request_flops(p, o, c) for p, o, c in requests)
    achieved = flops / seconds
    output = sum(o for _, o, _ in requests)
    ceiling_s = flops / gemm["flops_per_s"]
    return {
        "kind": "flops",
        "flops": flops,
        "flops_per_output_token": flops / output,
        "achieved_flops_per_s": achieved,
        "peak_flops_per_s": gemm["flops_per_s"],
        "fraction": achieved / gemm["flops_per_s"],
        "bound_output_tok_s": output / ceiling_s,
        "moe": shape.moe_figures(),
        "gemm": gemm,
    }


def bandwidth_roofline(shape: ModelShape, decode_tok_s: float, copy: dict[str, Any]) -> dict[str, Any]:
    """Decode tok/s of one stream against weight bytes per token over the measured copy bandwidth."""
    bound = copy["bytes_per_s"] / shape.weight_bytes_per_token
    return {
        "kind": "bandwidth",
        "weight_bytes_per_token": shape.weight_bytes_per_token,
        "total_weight_bytes": shape.total_weight_bytes,
        "moe": shape.moe_figures(),
        "peak_bytes_per_s": copy["bytes_per_s"],
        "achieved_bytes_per_s": decode_tok_s * shape.weight_bytes_per_token,
        "bound_tok_s": bound,
        "fraction": decode_tok_s / bound,
        "copy": copy,
    }
