"""The kernels as torch custom ops, so a captured step traces as one graph with no host reads.

``torch.compile(fullgraph=True)`` cannot look inside a Triton launch from Python; as opaque custom ops
(with shape-only fake implementations) the launches appear as single nodes, and their Python ints are
graph constants, exactly what a HIP, CUDA or XPU graph freezes. Importing this module imports triton.
"""

from __future__ import annotations

import torch

from paged_triton import launch as kernels


@torch.library.custom_op("paged_triton::write_kv", mutates_args=("kv_cache",))
def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store keys and values at their slots (see :func:`paged_triton.launch.write_kv`)."""
    kernels.write_kv(key, value, kv_cache, slot_mapping)


@write_kv.register_fake
def _write_kv_fake(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    return None


@torch.library.custom_op("paged_triton::attention", mutates_args=())
def attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    soft_cap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """Paged attention over the cache (see :func:`paged_triton.launch.attention`)."""
    return kernels.attention(
        query,
        kv_cache,
        query_start_loc,
        seq_lens,
        block_table,
        num_decodes,
        num_prefills,
        max_query_len,
        max_seq_len,
        scale,
        soft_cap,
        window,
    )


@attention.register_fake
def _attention_fake(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    soft_cap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    return query.new_empty(query.shape)


@torch.library.custom_op("paged_triton::lora_shrink", mutates_args=())
def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Multi-LoRA shrink (see :func:`paged_triton.lora_launch.lora_shrink`)."""
    from paged_triton import lora_launch

    return lora_launch.lora_shrink(x, a, slots)


@lora_shrink.register_fake
def _lora_shrink_fake(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], a.shape[1]), dtype=torch.float32)


@torch.library.custom_op("paged_triton::lora_expand", mutates_args=("y",))
def lora_expand(y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """Multi-LoRA expand, in place on ``y`` (see :func:`paged_triton.lora_launch.lora_expand`)."""
    from paged_triton import lora_launch

    lora_launch.lora_expand(y, shrunk, b, slots)


@lora_expand.register_fake
def _lora_expand_fake(y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    return None


@torch.library.custom_op("paged_triton::moe_experts", mutates_args=())
def moe_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """Routed experts over dense weights (see :func:`paged_triton.moe_launch.experts`)."""
    from paged_triton import moe_launch

    return moe_launch.experts(x, weights, ids, gate_up, down, activation)


@moe_experts.register_fake
def _moe_experts_fake(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    return x.new_empty(x.shape)
