"""Layer kernels a backend may supply beside attention (plugin API v1, optional).

The engine's fused decoder (:mod:`paged_core.runner.fused`) runs every layer
of the model families it knows through one :class:`FusedOps` object, which a
backend returns from :meth:`AttentionBackend.fused_ops`. The methods of this
base class are the pure-torch reference (and the conformance suite's
oracle): a backend overrides the ones it has kernels for and inherits the
rest. All arithmetic of the reference is done in fp32 and rounded once to
the input dtype, which is what a fused kernel does too.

============================  =====================================================================
op                            meaning (``T`` tokens; every input may be a strided view)
============================  =====================================================================
``rms_norm(x, w, eps)``       ``x / sqrt(mean(x**2) + eps) * w`` over the last dim of ``[T, H]``
``add_rms_norm(x, r, w, eps)`` ``s = x + r``; returns ``(rms_norm(s, w, eps), s)``
``silu_and_mul(x)``           ``[T, 2I] -> [T, I]``: ``silu(x[:, :I]) * x[:, I:]``
``rotary(pos, q, k, cache)``  rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hk, D]`` at ``pos`` ``[T]`` with
                              ``cache`` ``[max_pos, D]`` = ``cos`` halves then ``sin`` halves
                              (``cache[p, :D/2] = cos``, ``cache[p, D/2:] = sin``), NeoX style
                              (dimension ``i`` pairs with ``i + D/2``); returns new ``(q, k)``
``rotate_heads(x)``           ``x`` ``[T, H, D]``: each head vector times :func:`head_rotation` ``R(D)``
                              (block-diagonal normalised Hadamard; symmetric and orthogonal, so rotating
                              twice gives ``x`` back); returns a new contiguous ``[T, H, D]``
``pack_linear(w, b)``         called once per weight at load; returns the backend's
                              :class:`PackedLinear` (a layout its ``linear`` reads). ``w`` is a
                              dense tensor or a :class:`~paged_core.quant.QuantizedWeight`
``linear(x, packed)``         ``x @ w.T + b`` for ``x`` ``[T, K]``; returns ``[T, N]`` in ``x.dtype``
                              (a packed ``w`` as if dequantized exactly, see below)
``lora_shrink(x, a, slots)``  multi-LoRA, first product: ``out[t] = x[t] @ a[slots[t]].T`` for ``a``
                              ``[S, R, K]`` (every resident adapter's stacked A); ``[T, R]`` in fp32,
                              zero where ``slots[t] < 0`` (a token without an adapter)
``lora_expand(y, s, b, slots)`` second product, in place: ``y[t] += s[t] @ b[slots[t]].T`` for ``b``
                              ``[S, N, R]`` (scaling folded in); rows with ``slots[t] < 0`` untouched;
                              returns ``y``
``pack_experts(gu, down)``    called once per MoE layer at load; returns the backend's
                              :class:`~paged_core.contract.moe.PackedExperts` (dense ``gu`` ``[E, 2I, H]``
                              and ``down`` ``[E, H, I]``, or stacked packed rows; see there)
``moe(x, logits, experts, r)`` routed experts of ``x`` ``[T, H]``: ``logits`` ``[T, E]`` routed by
                              ``r`` (:class:`~paged_core.contract.moe.MoERouting`), each token's ``k``
                              experts' ``down(act(gate) * up)`` summed with their weights; ``[T, H]``.
                              The base routes, then calls ``experts``
``experts(x, w, ids, e, act)`` the same for a routing computed elsewhere (a model's own router,
                              expert parallelism's dispatched rows): ``w`` ``[T, k]`` float, ``ids``
                              ``[T, k]`` integer experts of ``e``; ``[T, H]``
============================  =====================================================================

**Packed weights.** ``linear_formats`` names the packed formats
(:data:`paged_core.quant.FORMATS`: ``q4_0``, ``q4_1``, ``q8_0``, ``q4_k``, ``q6_k``,
``int8``) whose products the backend computes itself; the engine gives
``pack_linear`` only weights of those formats (and dense ones) and packs every
other format with this reference class, logging why. So a backend's ``linear``
receives :class:`PackedLinear` objects it did not make (the reference's, of
any format) and must pass those to ``super().linear``. The reference
multiplies a packed weight by dequantizing it exactly in fp32
(:func:`paged_core.quant.reference_linear`): the oracle of the conformance
suite's linear section. A kernel may sum in another order. It may also round
the activations to int8 per 32-wide block
(:func:`paged_core.quant.round_activations_q8`) for the formats it names in
``q8_activation_formats``: the suite then accepts the exact product with
either the activations given or those rounded ones.

**Batch invariance** (DESIGN.md, "a contract property"). ``batch_invariant_linear`` names the
weight kinds (packed formats and dense dtypes, :func:`linear_kind`) whose ``linear`` gives each
row of ``x`` the same output bits whatever other rows share the call, and
``batch_invariant_layer_ops`` says the same of the five layer ops, row by row (token by token
for ``rotary`` and ``rotate_heads``). This base class declares neither: torch picks its matmul kernel, and so the
order of each row's sums, by the row count (measured with MKL: float32 rows differ between
``M = 1`` and ``M = 2``, bfloat16 from 33 rows), and splits an elementwise op between threads
by its total size, so that part of a row can take the scalar path of ``silu``'s ``exp``
(measured: one row of 429 in ``silu_and_mul``). The reference backend's ops
(:class:`paged_core.reference.fused.ReferenceFusedOps`) run this arithmetic one row at a time
and declare every kind. The conformance suite's batch-invariance section checks declarations
bit for bit; the engine reports whether a running configuration is invariant from them.

Like attention, these are called inside captured or compiled steps: an
override must be a torch custom op with a fake (meta) implementation, must
not read tensors on the host, and must return new tensors (inputs are never
modified), except ``lora_expand``, which adds into ``y`` (declare the
mutation in its schema). The reference's LoRA pair reads the slots on the
host (it groups tokens by adapter), so the engine runs LoRA steps eagerly; so
does the reference ``experts`` (it groups tokens by expert): a step holding it runs
eagerly unless the backend overrides ``experts`` (or ``moe``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from paged_core.contract.moe import (
    Activation,
    ExpertWeight,
    MoERouting,
    PackedExperts,
    apply_experts,
    check_moe_inputs,
    route_experts,
)
from paged_core.quant import FORMATS, QuantizedWeight, reference_linear

DENSE_LINEAR_KINDS: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""Dense weight dtypes by name, as :attr:`FusedOps.batch_invariant_linear` lists them."""
LINEAR_KINDS: tuple[str, ...] = (*FORMATS, *DENSE_LINEAR_KINDS)
"""Every weight kind :attr:`FusedOps.batch_invariant_linear` may name: the packed formats
(:data:`paged_core.quant.FORMATS`), then the dense dtypes."""
LAYER_OPS: tuple[str, ...] = ("rms_norm", "add_rms_norm", "silu_and_mul", "rotary", "rotate_heads")
"""The ops :attr:`FusedOps.batch_invariant_layer_ops` speaks for."""


def linear_kind(weight: torch.Tensor | QuantizedWeight) -> str:
    """A weight's kind as :attr:`FusedOps.batch_invariant_linear` names it: its packed format (``"q4_0"``...)
    or its dense dtype (``"bfloat16"``...)."""
    if isinstance(weight, QuantizedWeight):
        return weight.format.name
    return str(weight.dtype).removeprefix("torch.")


def rotation_block(head_size: int) -> int:
    """The block size ``b`` of :func:`head_rotation`: the largest power of two dividing ``head_size``."""
    if head_size < 1:
        raise ValueError(f"head_size must be positive, got {head_size}")
    return head_size & -head_size


def head_rotation(head_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``R(D)``, the matrix :meth:`FusedOps.rotate_heads` multiplies each head vector by: a new ``[D, D]`` float32.

    Block-diagonal, ``D / b`` blocks of ``H_b / sqrt(b)``, where ``b`` is the largest power of two dividing
    ``D`` (:func:`rotation_block`: 64 for ``D = 64``, 16 for ``D = 80``, 32 for ``D = 96``) and ``H_b`` the
    Sylvester Hadamard matrix in natural order (``H_1 = [1]``, ``H_2k = [[H_k, H_k], [H_k, -H_k]]``: entry
    ``(i, j)`` is ``(-1) ** popcount(i & j)``). ``R`` is symmetric and orthogonal, so ``R @ R`` is the
    identity: ``(q R) . (k R) = q . k`` and rotating twice gives a vector back. Each entry is ``+-1 / sqrt(b)``
    rounded once to float32.
    """
    b = rotation_block(head_size)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < b:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    block = (h / math.sqrt(b)).float()
    r = torch.zeros(head_size, head_size)
    for i in range(0, head_size, b):
        r[i : i + b, i : i + b] = block
    return r.to(device)


_ROTATIONS: dict[tuple[int, torch.device], torch.Tensor] = {}
""":func:`head_rotation` per head size and device, for :meth:`FusedOps.rotate_heads` (built on first use)."""


def _rotation(head_size: int, device: torch.device) -> torch.Tensor:
    # A plain dict, not functools.lru_cache: torch.compile traces through it without a warning. Built on the host
    # and copied: a first use inside a device-graph capture then fails loudly rather than recording garbage.
    r = _ROTATIONS.get((head_size, device))
    if r is None:
        r = _ROTATIONS[(head_size, device)] = head_rotation(head_size, device)
    return r


@dataclass
class PackedLinear:
    """One linear layer's weight in the form a backend's :meth:`FusedOps.linear` reads.

    ``weight`` ``[out_features, in_features]`` and ``bias`` are the model's own
    tensors (the reference multiplies them), the weight either dense or a
    :class:`~paged_core.quant.QuantizedWeight` in its packed format; ``packed``
    is whatever the backend made of them at load (``None`` for the reference).
    """

    weight: torch.Tensor | QuantizedWeight
    bias: torch.Tensor | None = None
    packed: Any = None

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])


class FusedOps:
    """The reference implementation of every fused op; backends subclass and override what they accelerate."""

    name: ClassVar[str] = "reference"
    """Shown in logs and conformance reports."""

    linear_formats: ClassVar[frozenset[str]] = frozenset(FORMATS)
    """Packed weight formats :meth:`linear` multiplies itself (the reference: all, by dequantizing).

    A backend declares the formats it has kernels for (``frozenset()``: none);
    the engine packs weights of other formats with the reference instead. A
    subclass that overrides ``pack_linear`` or ``linear`` without declaring
    (nor inheriting from a class between it and this one) gets ``frozenset()``:
    a dense-only port never claims the reference's formats by inheritance."""

    q8_activation_formats: ClassVar[frozenset[str]] = frozenset()
    """Formats (of ``linear_formats``) whose :meth:`linear` may round ``x`` first, per row and 32-wide
    block, to int8 with an fp32 scale exactly as :func:`paged_core.quant.round_activations_q8` does
    (at any row count it chooses; the reference never does). Integer dot products over the blocks'
    small integers are what makes one stream over q4 weights fast on CPUs (llama.cpp's q8
    activations); a backend that does so says it here so that its conformance tolerance says so too."""

    batch_invariant_linear: ClassVar[frozenset[str]] = frozenset()
    """Weight kinds whose :meth:`linear` gives each row of ``x`` the same output bits whatever other rows
    share the call: how many, which, in what order, in what chunks (a row of a 512-row prefill equals the
    same row alone, bit for bit). Entries are packed format names (:data:`paged_core.quant.FORMATS`:
    ``q4_0``, ``q4_1``, ``q8_0``, ``q4_k``, ``q6_k``, ``int8``) and dense dtype names (``float32``,
    ``bfloat16``, ``float16``): :func:`linear_kind` of the weight, for every compute dtype of ``x`` the
    backend declares. Such a kernel reduces each output in an order fixed by the layer's sizes, never by
    the row count (fixed tiles, one rounding rule for the activations at every row count).

    This class declares none (torch's matmul changes kernels with the row count; see the module
    docstring). A subclass that overrides ``pack_linear`` or ``linear`` without declaring (nor inheriting
    from a class between it and this one) gets ``frozenset()``, as for :attr:`linear_formats`. The
    conformance suite checks every declared kind bit for bit; the engine counts a model's linear
    layers invariant only when their kinds are declared here."""

    batch_invariant_layer_ops: ClassVar[bool] = False
    """Whether :meth:`rms_norm`, :meth:`add_rms_norm`, :meth:`silu_and_mul`, :meth:`rotary` and
    :meth:`rotate_heads` (the five :data:`LAYER_OPS`) give each row (token) the same output bits whatever
    other rows share the call, in every dtype the backend declares. This class does not promise it (torch
    splits an elementwise op between threads by its size, and picks its matmul kernel by the row count; see
    the module docstring). A subclass that overrides any of the five without declaring (nor inheriting from
    a class between it and this one) gets ``False``."""

    moe_formats: ClassVar[frozenset[str]] = frozenset(FORMATS)
    """Packed formats whose expert weights :meth:`pack_experts`, :meth:`moe` and :meth:`experts` serve themselves
    (the reference: all, by dequantizing each expert it uses exactly in fp32).

    As :attr:`linear_formats` for linears: the engine gives ``pack_experts`` only layers whose ``gate_up`` and
    ``down`` are each dense or of a format named here, packs the others with this reference class, and a
    backend's ``experts`` (and ``moe``) must pass :class:`~paged_core.contract.moe.PackedExperts` it did not
    make to ``super()``. Formats of :attr:`q8_activation_formats` named here may have the input of each of the
    two products rounded likewise. A subclass that overrides ``pack_experts``, ``moe`` or ``experts`` without
    declaring (nor inheriting from a class between it and this one) gets ``frozenset()``."""

    batch_invariant_moe: ClassVar[frozenset[str]] = frozenset()
    """Weight kinds (as :attr:`batch_invariant_linear` names them) whose :meth:`moe` and :meth:`experts` give each
    token the same output bits whatever other tokens share the call (and so whatever other tokens its experts
    serve). A layer
    counts when both its kinds (:attr:`PackedExperts.kinds <paged_core.contract.moe.PackedExperts.kinds>`) are
    named, for every compute dtype the backend declares. This class declares none: it multiplies each
    expert's group of tokens with torch's matmul, whose kernel changes with the group's row count. A subclass
    that overrides ``pack_experts``, ``moe`` or ``experts`` without declaring gets ``frozenset()``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

        def declared(name: str) -> bool:
            return any(name in vars(c) for c in cls.__mro__ if c is not FusedOps)

        overrides = cls.pack_linear is not FusedOps.pack_linear or cls.linear is not FusedOps.linear
        if overrides and not declared("linear_formats"):
            cls.linear_formats = frozenset()
        if overrides and not declared("batch_invariant_linear"):
            cls.batch_invariant_linear = frozenset()
        own_moe = any(getattr(cls, op) is not getattr(FusedOps, op) for op in ("pack_experts", "moe", "experts"))
        if own_moe and not declared("moe_formats"):
            cls.moe_formats = frozenset()
        if own_moe and not declared("batch_invariant_moe"):
            cls.batch_invariant_moe = frozenset()
        layer_ops = any(getattr(cls, op) is not getattr(FusedOps, op) for op in LAYER_OPS)
        if layer_ops and not declared("batch_invariant_layer_ops"):
            cls.batch_invariant_layer_ops = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMS normalisation of ``[T, H]`` over ``H``, times ``weight`` ``[H]``."""
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (normed * weight.float()).to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add then RMS norm: returns ``(rms_norm(x + residual), x + residual)``."""
        summed = (x.float() + residual.float()).to(x.dtype)
        return self.rms_norm(summed, weight, eps), summed

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """The gated activation of a merged gate/up projection: ``silu(gate) * up``."""
        half = x.shape[-1] // 2
        xf = x.float()
        return (torch.nn.functional.silu(xf[..., :half]) * xf[..., half:]).to(x.dtype)

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """NeoX-style rotary embedding of ``query`` and ``key`` at ``positions`` (see the module table)."""
        half = cos_sin_cache.shape[-1] // 2
        cs = cos_sin_cache.index_select(0, positions).float()
        cos, sin = cs[:, None, :half], cs[:, None, half:]

        def rotate(t: torch.Tensor) -> torch.Tensor:
            tf = t.float()
            a, b = tf[..., :half], tf[..., half:]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(t.dtype)

        return rotate(query), rotate(key)

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Each head vector of ``x`` ``[T, H, D]`` (any strides) times :func:`head_rotation` ``R(D)``: a new
        contiguous ``[T, H, D]`` in ``x.dtype``, computed in float32 and rounded once.

        The engine rotates q, k and v before a quantized KV cache stores them, and the attention output back
        (``R`` is its own inverse): each vector's energy is spread over all its channels, so one scale per
        vector loses less. This reference is one float32 matmul with ``R`` (cached per head size and device);
        a kernel may use the fast Walsh-Hadamard butterfly instead (``log2(b)`` stages of sums and
        differences per block, then times ``1 / sqrt(b)``), which rounds differently and is what a
        batch-invariant backend runs (the reference backend, :mod:`paged_core.reference.fused`).
        """
        return (x.float() @ _rotation(x.shape[-1], x.device)).to(x.dtype)

    def pack_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> PackedLinear:
        """Prepare one weight for :meth:`linear` (called once at load). The reference keeps it as is."""
        return PackedLinear(weight, bias)

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        """``x @ weight.T + bias`` in ``x.dtype`` (a packed weight dequantized exactly, in fp32)."""
        if isinstance(packed.weight, QuantizedWeight):
            return reference_linear(x, packed.weight, packed.bias)
        if x.dim() == 2 and x.stride(0) != x.shape[1]:
            # torch 2.13's bf16 GEMM on AMX CPUs (Sapphire Rapids) reads past the end of each row of a view whose
            # row stride exceeds its width when K is not a multiple of 32 (NaN from beyond the view, measured).
            x = x.contiguous()
        return torch.nn.functional.linear(x, packed.weight, packed.bias)

    def pack_experts(self, gate_up: ExpertWeight, down: ExpertWeight) -> PackedExperts:
        """Prepare one MoE layer's experts for :meth:`moe` (called once at load). The reference keeps them as is.

        ``gate_up`` and ``down`` are dense ``[E, 2I, H]`` and ``[E, H, I]`` or stacked packed rows (the layouts
        of :class:`~paged_core.contract.moe.PackedExperts`, which refuses ones that do not fit together).
        """
        return PackedExperts(gate_up, down)

    def moe(
        self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
    ) -> torch.Tensor:
        """Routed experts: ``out[t] = sum_j w[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t]))``, ``e = ids[t, j]``.

        ``x`` ``[T, H]`` (any float dtype, possibly a strided view), ``router_logits`` ``[T, E]`` (the router's
        product), ``(w, ids) = route_experts(router_logits, routing)``
        (:func:`~paged_core.contract.moe.route_experts`: the routing rule, float32 weights). Returns a new
        ``[T, H]`` in ``x.dtype``. The reference (:func:`~paged_core.contract.moe.reference_moe`) sorts the
        tokens by expert, runs each expert that has tokens on its tokens in float32 (a packed expert
        dequantized exactly), and sums each token's ``k`` outputs times their weights in slot order in
        float32, rounded once: a token's sum does not depend on the other tokens. Experts no token chose are
        skipped. Refuses (:class:`~paged_core.errors.UnsupportedConfigError`, naming the shapes) experts or
        inputs that do not fit the routing. It reads the per-expert counts on the host: eager steps only.

        This base checks the shapes, routes, and calls :meth:`experts`: a backend with an experts kernel
        overrides that, and overrides ``moe`` only to fuse the routing too.
        """
        check_moe_inputs(x, router_logits, experts, routing)
        weights, ids = route_experts(router_logits, routing)
        return self.experts(x, weights, ids, experts, routing.activation)

    def experts(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        experts: PackedExperts,
        activation: Activation = "silu",
    ) -> torch.Tensor:
        """The experts half of :meth:`moe`, for a routing computed elsewhere: ``[T, H]`` in ``x.dtype``.

        ``x`` ``[T, H]``; ``weights`` ``[T, k]`` (any float dtype, read in float32) and ``ids`` ``[T, k]`` (any
        integer dtype, each in ``0 .. E - 1``): each token's experts and their weights, from :func:`route_experts
        <paged_core.contract.moe.route_experts>` or a model's own router (transformers' ``*Experts`` modules get
        ``top_k_index`` and ``top_k_weights``), or the rows expert parallelism dispatched to this rank.
        ``out[t] = sum_j weights[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t]))`` with ``e = ids[t, j]``, the
        ``k`` terms summed in slot order in float32 and rounded once. The reference is
        :func:`~paged_core.contract.moe.apply_experts` (it reads the per-expert counts on the host, and refuses
        ids outside the experts; a kernel need not check ids on the device).
        """
        return apply_experts(x, weights, ids, experts, activation)

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Multi-LoRA shrink: ``[T, R]`` fp32 with row ``t`` = ``x[t] @ a[slots[t]].T`` (0 where ``slots[t] < 0``).

        ``x`` ``[T, K]`` is the projection's input, ``a`` ``[S, R, K]`` the A matrices of every resident
        adapter slot (ranks zero-padded to ``R``; a merged projection's parts stacked along ``R``), ``slots``
        ``[T]`` int64 each token's adapter slot. The reference groups the tokens by slot (one product per
        adapter in the batch); punica's segmented kernels are the GPU form of the same.
        """
        out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
        for slot in torch.unique(slots).tolist():
            if slot < 0:
                continue
            rows = (slots == slot).nonzero().squeeze(1)
            out.index_copy_(0, rows, x.index_select(0, rows).float() @ a[slot].float().T)
        return out

    def lora_expand(self, y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Multi-LoRA expand, in place: ``y[t] += shrunk[t] @ b[slots[t]].T`` (rounded once to ``y.dtype``).

        ``y`` ``[T, N]`` is the base projection's output, ``shrunk`` ``[T, R]`` what :meth:`lora_shrink`
        returned, ``b`` ``[S, N, R]`` the B matrices of every slot with the adapter's scaling folded in (a
        merged projection's parts block-diagonal: part ``i``'s rows read only its own rank columns); tokens
        with ``slots[t] < 0`` are left as they are. Returns ``y``.
        """
        for slot in torch.unique(slots).tolist():
            if slot < 0:
                continue
            rows = (slots == slot).nonzero().squeeze(1)
            delta = shrunk.index_select(0, rows) @ b[slot].float().T
            y.index_copy_(0, rows, (y.index_select(0, rows).float() + delta).to(y.dtype))
        return y

    def apply_token_bitmask(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | torch.Tensor
    ) -> None:
        """Structured outputs: forbid in place the tokens ``bitmask`` does not allow on rows ``rows`` of ``logits``.

        ``logits`` is a step's ``[batch, vocab]`` on the device; ``bitmask`` ``[len(rows), ceil(vocab / 32)]``
        int32 on the CPU, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed (llguidance's and
        xgrammar's layout); a forbidden token's logit becomes ``-inf``, as do columns past the mask. Unlike the
        layer ops this one runs outside captured steps, between the forward and the sampler, and writes its
        input. The reference is :func:`paged_core.structured.bitmask.apply_bitmask` (a torch lookup-table add);
        a backend may override it with an in-place kernel.
        """
        from paged_core.structured.bitmask import apply_bitmask  # the structured package loads llguidance lazily

        apply_bitmask(logits, bitmask, rows)
