"""Rooflines: the work a run had to do, against the ceilings measured on the same machine.

``throughput`` counts FLOPs: every token computed passes through the body's
weights (2 FLOPs per parameter), every sampled token through the LM head,
and attention costs ``4 x heads x head_dim`` per layer per token of context
(QK^T and PV). Prefix-cache hits are not computed, so they are not counted;
recompute after preemption is real work but not counted either (the
fraction can only be understated). ``decode-1`` counts bytes: one decode
step reads every weight once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


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
    """Bytes one decode step reads when some weights are packed (``None``: every weight dense, ``element_size``)."""

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> ModelShape:
        """Read the shape from a transformers causal LM (tied embeddings are counted once, as the head).

        Packed linear layers (:class:`~paged_core.runner.packed_linear.PackedLinearModule`) count their
        weights' elements as parameters and their packed bytes as what a decode step reads.
        """
        from paged_core.runner.packed_linear import packed_bytes, packed_modules

        params = {id(p): p for p in model.parameters()}
        embed = model.get_input_embeddings().weight  # type: ignore[operator]
        head_module = model.get_output_embeddings()  # type: ignore[operator]
        packed = packed_modules(model)
        head_q = getattr(head_module, "qweight", None)
        head_numel = head_q.out_features * head_q.in_features if head_q is not None else head_module.weight.numel()
        head_is_embed = head_q is None and head_module.weight is embed
        dense = sum(p.numel() for p in params.values())
        packed_numel = sum(m.out_features * m.in_features for _, m in packed)
        total = dense + packed_numel
        skip = embed.numel() + (head_numel if not head_is_embed else 0)
        cfg = model.config.get_text_config()  # type: ignore[operator, union-attr]
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        weight_bytes = None
        if packed:  # dense body tensors (norms, biases) plus every packed byte; the embedding row is negligible
            body_dense = sum(p.numel() * p.element_size() for p in params.values() if p is not embed)
            weight_bytes = body_dense + packed_bytes(model)
        return cls(
            total - skip, head_numel, int(cfg.num_hidden_layers), heads, head_dim, embed.element_size(), weight_bytes
        )

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (body and LM head; the embedding row is negligible)."""
        if self.weight_bytes is not None:
            return self.weight_bytes
        return (self.body_params + self.head_params) * self.element_size

    def request_flops(self, num_prompt: int, num_output: int, num_cached: int = 0) -> int:
        """FLOPs to serve one request whose first ``num_cached`` prompt tokens came from the prefix cache."""
        n = num_prompt + num_output - 1  # the last sampled token is never fed back
        c = min(num_cached, n)
        context = (n * (n + 1) - c * (c + 1)) // 2  # token at position p attends to p + 1 positions
        attention = 4 * self.num_layers * self.num_heads * self.head_dim * context
        return 2 * self.body_params * (n - c) + 2 * self.head_params * num_output + attention


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
        "gemm": gemm,
    }


def bandwidth_roofline(shape: ModelShape, decode_tok_s: float, copy: dict[str, Any]) -> dict[str, Any]:
    """Decode tok/s of one stream against weight bytes per token over the measured copy bandwidth."""
    bound = copy["bytes_per_s"] / shape.weight_bytes_per_token
    return {
        "kind": "bandwidth",
        "weight_bytes_per_token": shape.weight_bytes_per_token,
        "peak_bytes_per_s": copy["bytes_per_s"],
        "achieved_bytes_per_s": decode_tok_s * shape.weight_bytes_per_token,
        "bound_tok_s": bound,
        "fraction": decode_tok_s / bound,
        "copy": copy,
    }
