"""Routed experts (``FusedOps.pack_experts`` and ``moe``): layers, router logits, the oracle and its tolerance.

The oracle is the reference ``FusedOps().moe`` on the CPU, on contiguous copies of the inputs and on
experts packed by the reference from pristine copies of the weights (no device library, no TF32). It
routes, runs each expert in float32 (a packed one dequantized exactly) and sums each token's experts in
float32, rounded once; a backend's result must be within the dtype's tolerance of it
(:data:`paged_conformance.harness.TOLERANCES`). For packed formats of both ``moe_formats`` and
``q8_activation_formats`` a result also passes within :data:`Q8_TOLERANCE` of the same arithmetic with the
input of each product rounded to int8 per 32-wide block (:func:`paged_core.testing.round_activations_q8`,
where the product's input size is a multiple of 32): a kernel whose intermediate differs from the oracle's
by a rounding may round one value to the neighbouring int8 step, which the float32 tolerance does not hold.

Router logits keep every choice well defined: the random ones are a permutation of values at least 0.05
apart per token (no near tie for a kernel's other summation order to flip), and the ``ties`` ones exact
ties, which the contract sends to the lower expert id.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from paged_conformance.fused import REFERENCE, Untouched, column_view, generator, randn
from paged_conformance.grid import MOE_ROUTINGS, MOE_TOKENS, MoEShape, dtype_name
from paged_conformance.harness import TOLERANCES
from paged_core.api import LINEAR_FORMATS, LINEAR_KINDS, FusedOps, MoERouting, PackedExperts, QuantizedWeight
from paged_core.api import route_experts as route
from paged_core.testing import dequantize, random_packed, round_activations_q8

Q8_TOLERANCE = 1e-2
"""Relative (and absolute, times the largest output magnitude) tolerance against the q8-rounded oracle."""
FAR = 30.0
"""How far logits are pushed to keep an expert out of (or in) every token's choice."""

ExpertWeight = torch.Tensor | QuantizedWeight
Packer = Callable[[ExpertWeight, ExpertWeight], PackedExperts]


def routing_of(shape: MoEShape) -> MoERouting:
    """The :class:`~paged_core.api.MoERouting` of ``shape``."""
    return MoERouting(shape.experts, shape.top_k, **MOE_ROUTINGS[shape.routing])  # type: ignore[arg-type]


def router_logits(gen: torch.Generator, tokens: int, experts: int, top_k: int, distribution: str) -> torch.Tensor:
    """Float32 ``[tokens, experts]`` logits on the CPU for one of :data:`~paged_conformance.grid.MOE_DISTRIBUTIONS`."""
    if distribution == "ties":
        return torch.randint(-1, 2, (tokens, experts), generator=gen).float()
    ranks = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]).float()
    logits = (ranks - experts / 2) * (6.0 / experts + 0.05) + 0.02 * torch.rand(tokens, experts, generator=gen)
    if distribution == "few_experts":  # only top_k + 1 experts ever chosen: the others stay empty
        chosen = torch.randperm(experts, generator=gen)[: top_k + 1]
        mask = torch.full((experts,), -FAR)
        mask[chosen] = 0.0
        logits = logits + mask
    elif distribution == "one_expert":  # every token's first choice: one expert
        logits[:, experts // 2] += FAR
    return logits


def dense_experts(gen: torch.Generator, shape: MoEShape) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 ``gate_up`` ``[E, 2I, H]`` and ``down`` ``[E, H, I]`` on the CPU, outputs of order 1."""
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    return randn(gen, e, 2 * i, h, scale=h**-0.5), randn(gen, e, h, i, scale=i**-0.5)


def packed_experts(fmt: str, shape: MoEShape) -> tuple[QuantizedWeight, QuantizedWeight]:
    """Random packed ``gate_up`` ``(E * 2I, H)`` of ``fmt`` and ``down`` ``(E * H, I)`` (of ``shape.down_format``
    when set), on the CPU, the same for every dtype."""
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    down_fmt = shape.down_format or fmt
    gen = generator(zlib.crc32(f"moe-weights-{fmt}-{shape.label}".encode()))
    gate_up = random_packed(LINEAR_FORMATS[fmt], e * 2 * i, h, gen, scale=h**-0.5, name=f"{fmt} gate_up")
    down = random_packed(LINEAR_FORMATS[down_fmt], e * h, i, gen, scale=i**-0.5, name=f"{down_fmt} down")
    return gate_up, down


def kind_experts(kind: str, shape: MoEShape, gen: torch.Generator) -> tuple[ExpertWeight, ExpertWeight]:
    """Experts of one weight kind on the CPU: random packed bytes of a format, or dense ones of a dtype."""
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    if kind in LINEAR_FORMATS:
        fmt = LINEAR_FORMATS[kind]
        return random_packed(fmt, e * 2 * i, h, gen, scale=h**-0.5), random_packed(fmt, e * h, i, gen, scale=i**-0.5)
    gate_up, down = dense_experts(gen, shape)
    return gate_up.to(getattr(torch, kind)), down.to(getattr(torch, kind))


def fresh(w: ExpertWeight, device: torch.device, dtype: torch.dtype | None = None) -> ExpertWeight:
    """A copy of ``w`` (its own memory) on ``device``; a dense one in ``dtype``."""
    if isinstance(w, QuantizedWeight):
        scale = None if w.scale is None else w.scale.to(device, copy=True)
        return QuantizedWeight(w.format, w.shape, w.data.to(device, copy=True), scale, w.name)
    return w.to(device=device, dtype=dtype or w.dtype, copy=True)


def declared(ops: FusedOps, attribute: str) -> frozenset[str]:
    """``ops``' declaration ``attribute`` (``moe_formats``, ``batch_invariant_moe``...) as names; none when it is
    no collection (the declaration check fails that)."""
    names = getattr(ops, attribute, None)
    return frozenset(str(n) for n in names) if isinstance(names, (set, frozenset, list, tuple)) else frozenset()


def check_declaration(ops: FusedOps) -> None:
    """``moe_formats`` is a frozenset of known packed formats, ``batch_invariant_moe`` one of known weight kinds."""
    cls = type(ops).__name__
    for attribute, known in (("moe_formats", tuple(LINEAR_FORMATS)), ("batch_invariant_moe", LINEAR_KINDS)):
        names = getattr(ops, attribute, None)
        if not isinstance(names, frozenset) or not all(isinstance(n, str) for n in names):
            raise AssertionError(f"{cls}.{attribute} must be a frozenset of names (known: {', '.join(known)})")
        unknown = sorted(names - set(known))
        if unknown:
            raise AssertionError(f"{cls}.{attribute} names unknown {unknown}; known: {', '.join(known)}")


# --- the oracle --------------------------------------------------------------------------------------------------


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "silu":
        return torch.nn.functional.silu
    return lambda t: torch.nn.functional.gelu(t, approximate="tanh")


def _q8(t: torch.Tensor, on: bool) -> torch.Tensor:
    return round_activations_q8(t) if on and t.shape[-1] % 32 == 0 else t


def q8_oracle(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: PackedExperts,
    activation: str,
    rounds: tuple[bool, bool],
) -> torch.Tensor:
    """The reference arithmetic (a routing given) with the input of the ``gate_up`` product (``rounds[0]``) and of
    the ``down`` product (``rounds[1]``) rounded as :func:`~paged_core.testing.round_activations_q8` does."""
    weights, ids = weights.float(), ids.long()
    inter, act = experts.intermediate_size, _activation(activation)
    out = torch.zeros(x.shape[0], experts.hidden_size)
    for e in torch.unique(ids).tolist():
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        gate_up, down = (dequantize(w) if isinstance(w, QuantizedWeight) else w.float() for w in experts.expert(e))
        h = _q8(x.index_select(0, tokens).float(), rounds[0]) @ gate_up.T
        y = _q8(act(h[:, :inter]) * h[:, inter:], rounds[1]) @ down.T
        out.index_add_(0, tokens, y * weights[tokens, slots, None])
    return out.to(x.dtype)


def assert_within(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, what: str) -> None:
    """Fail naming the worst element when ``|got - want| > atol + rtol * |want|`` anywhere (NaN fails)."""
    a, w = got.detach().float().cpu(), want.detach().float().cpu()
    err = (a - w).abs()
    bad = ~(err <= atol + rtol * w.abs())
    if not bad.any():
        return
    flat = int(err.nan_to_num(float("inf")).argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)]
    raise AssertionError(
        f"{what} mismatch: max abs error {float(err.nan_to_num(float('inf')).max()):.3g} at {index} (got "
        f"{float(a.reshape(-1)[flat]):.6g}, expected {float(w.reshape(-1)[flat]):.6g}); {int(bad.sum())}/"
        f"{bad.numel()} elements outside atol={atol:.3g}, rtol={rtol:.3g}"
    )


# --- one layer ---------------------------------------------------------------------------------------------------


@dataclass
class Layer:
    """One expert layer under test: the backend's packed experts and the reference's, its routing and what it is."""

    packed: PackedExperts
    reference: PackedExperts
    routing: MoERouting
    label: str
    rounds: tuple[bool, bool] = (False, False)
    """Whether a kernel may round the input of the ``gate_up`` / ``down`` product to q8 (declared formats)."""


def pack_layer(
    packer: Packer,
    gate_up: ExpertWeight,
    down: ExpertWeight,
    shape: MoEShape,
    device: torch.device,
    dtype: torch.dtype,
    label: str,
    rounds: tuple[bool, bool] = (False, False),
) -> tuple[Layer, Untouched]:
    """Pack copies of the pristine ``gate_up`` and ``down`` on ``device`` with ``packer`` (and on the CPU with the
    reference); check the result and return the layer with a guard over the weights handed to ``packer``."""
    gu, dn = fresh(gate_up, device, dtype), fresh(down, device, dtype)
    guard = Untouched(_weight_buffers(gu, dn))
    packed = packer(gu, dn)
    guard.check(f"pack_experts({label})")
    if not isinstance(packed, PackedExperts):
        raise AssertionError(f"pack_experts({label}) returned {type(packed).__name__}, not a PackedExperts")
    dims = (packed.num_experts, packed.hidden_size, packed.intermediate_size)
    if dims != (shape.experts, shape.hidden, shape.intermediate):
        raise AssertionError(f"pack_experts({label}) gave (E, H, I) = {dims}")
    reference = REFERENCE.pack_experts(
        fresh(gate_up, torch.device("cpu"), dtype), fresh(down, torch.device("cpu"), dtype)
    )
    return Layer(packed, reference, routing_of(shape), label, rounds), guard


def _weight_buffers(gate_up: ExpertWeight, down: ExpertWeight) -> dict[str, torch.Tensor | None]:
    out: dict[str, torch.Tensor | None] = {}
    for name, w in (("gate_up", gate_up), ("down", down)):
        if isinstance(w, QuantizedWeight):
            out[f"{name} bytes"], out[f"{name} scales"] = w.data, w.scale
        else:
            out[name] = w
    return out


def call_layer(
    ops: FusedOps, layer: Layer, x: torch.Tensor, logits: torch.Tensor, dtype: torch.dtype, what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ops.moe`` on ``x`` and ``logits`` (possibly views): a new ``[T, H]`` tensor in ``dtype`` on their device,
    the inputs untouched, within tolerance of the oracle. Returns (output, the oracle's output)."""
    x_ref, logits_ref = x.detach().cpu().contiguous(), logits.detach().cpu().contiguous()
    want = REFERENCE.moe(x_ref, logits_ref, layer.reference, layer.routing)
    guard = Untouched({"x": x, "router_logits": logits})
    got = ops.moe(x, logits, layer.packed, layer.routing)
    guard.check(what)
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what} returned {type(got).__name__}, not a tensor")
    guard.assert_not_aliased([got], what)
    if tuple(got.shape) != tuple(want.shape) or got.dtype != dtype or got.device != x.device:
        raise AssertionError(
            f"{what}: {tuple(got.shape)} {dtype_name(got.dtype)} on {got.device}, expected {tuple(want.shape)} "
            f"{dtype_name(dtype)} on {x.device}"
        )
    compare(got, want, layer, x_ref, *route(logits_ref, layer.routing), dtype, what)
    return got, want


def compare(
    got: torch.Tensor,
    want: torch.Tensor,
    layer: Layer,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    dtype: torch.dtype,
    what: str,
) -> None:
    """Within the dtype's tolerance of the oracle or, for a layer a kernel may round to q8, of the q8 oracle (``x``,
    ``weights`` and ``ids`` on the CPU: the routing the output was computed with)."""
    atol, rtol = TOLERANCES.get(dtype, (1e-2, 1e-2))
    if not any(layer.rounds):
        assert_within(got, want, atol, rtol, what)
        return
    try:
        assert_within(got, want, atol, rtol, what)
    except AssertionError as exact:
        q8 = q8_oracle(x, weights, ids, layer.reference, layer.routing.activation, layer.rounds)
        scale = max(1.0, float(q8.float().abs().max())) if q8.numel() else 1.0
        tol = max(Q8_TOLERANCE, rtol)
        try:
            assert_within(got, q8, tol * scale, tol, f"{what} (against the q8-rounded oracle)")
        except AssertionError as rounded:
            raise AssertionError(f"{exact}; nor does it fit the q8 rounding: {rounded}") from None


def run_layer(
    ops: FusedOps,
    layer: Layer,
    guard: Untouched,
    gen: torch.Generator,
    dtype: torch.dtype,
    strided: bool,
    device: torch.device,
    distributions: Sequence[str],
) -> None:
    """Every token count of :data:`~paged_conformance.grid.MOE_TOKENS` with every distribution (one token: random
    only), ``x`` and the logits column views when ``strided``; then every output compared again (a reused output
    buffer fails) and the weights checked untouched."""
    r = layer.routing
    done: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    for tokens in MOE_TOKENS:
        for dist in distributions if tokens > 1 else distributions[:1]:
            x = randn(gen, tokens, layer.packed.hidden_size).to(device, dtype)
            logits = router_logits(gen, tokens, r.num_experts, r.top_k, dist).to(device, dtype)
            if strided:
                x, logits = column_view(x), column_view(logits)
            what = f"moe(x [{tokens}, {x.shape[1]}], {layer.label}, {dist} routing{', strided' if strided else ''})"
            got, _ = call_layer(ops, layer, x, logits, dtype, what)
            done.append((what, got, got.clone()))
    for what, got, saved in done:
        if not torch.equal(got, saved):
            raise AssertionError(f"{what}: its output changed after later calls (an output buffer reused)")
    guard.check(f"moe over {layer.label} (its expert weights)")
