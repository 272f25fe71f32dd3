"""Routed experts: a backend's ``fused_ops().pack_experts`` and ``moe`` against the reference ``FusedOps()``.

Expert layers (:data:`~paged_conformance.grid.MOE_SHAPES`): 4, 8 and 60 experts, top-k 1, 2, 4 and 8,
odd hidden and intermediate sizes, Mixtral's routing (softmax, top-k renormalised), Qwen3-MoE's without
renormalising, a sigmoid router (renormalised, scaled) and the tanh-GELU gate; each at 1, 7 and 130
tokens, with the router's logits sending tokens at random, to ``top_k + 1`` experts only (the others
empty), every token's first choice to one expert, and in exact ties (which go to the lower expert id).
Dense experts at each declared dtype, with ``x`` and the logits contiguous and as column views; packed
experts (stacked rows, :class:`~paged_core.api.PackedExperts`) of each format, and of two formats at once
(``q4_k`` gate/up with ``q6_k`` down, as GGUF ``Q4_K_M`` files have), at each declared dtype: packed by
the backend's ``pack_experts`` where both formats are in its ``moe_formats``, else by the reference's (as
the engine packs them), whose experts the backend's ``moe`` must hand to ``super().moe``. ``experts`` (the op for a
routing computed elsewhere) is checked the same way with routings no router rule makes: distinct experts in no
order, int64 ids, unnormalised weights in the activations' dtype.

Each output must be a new ``[T, H]`` tensor in ``x``'s dtype on its device, within the dtype's tolerance
of the reference (see :mod:`paged_conformance.moe` for the one declared rounding, q8 activations), leave
``x``, the logits and the weights bit-identical, and stay unchanged after later calls. An override of
``moe`` must also trace as one graph (``torch.compile(fullgraph=True, backend="aot_eager")``) and read
nothing on the host; the reference's groups tokens by expert on the host (eager steps only), so the trace
check is N/A for it. Where ``batch_invariant_moe`` names a weight kind, each token's output bits must not
depend on the other tokens of the call (:mod:`paged_conformance.batch_invariance`'s row check).
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.batch_invariance import RowCheck
from paged_conformance.fused import REFERENCE, Untouched, as_tuple, column_view, generator, randn
from paged_conformance.grid import (
    INVARIANCE_POOL,
    MOE_DISTRIBUTIONS,
    MOE_INVARIANCE_SHAPE,
    MOE_SHAPES,
    FusedCase,
    InvarianceLinearCase,
    LinearFormatCase,
    MoEShape,
    dtype_name,
    moe_packed_shapes,
)
from paged_conformance.moe import (
    Layer,
    assert_within,
    check_declaration,
    compare,
    declared,
    dense_experts,
    fresh,
    kind_experts,
    pack_layer,
    packed_experts,
    router_logits,
    routing_of,
    run_layer,
)
from paged_conformance.session import Conformance
from paged_conformance.tracing import HostReads, first_line, own_entry
from paged_core.api import LINEAR_FORMATS, FusedOps, MoERouting, PackedExperts, UnsupportedConfigError


@pytest.mark.paged_capability("fused:moe")
@pytest.mark.paged_cases("fused")
def test_moe_dense(conformance: Conformance, fused: FusedCase) -> None:
    """Dense experts in the compute dtype, packed by the backend, over every shape, token count and routing."""
    ops, gen, device = conformance.fused_ops(), generator(fused.seed ^ 0x30E), conformance.device
    for shape in MOE_SHAPES:
        gate_up, down = dense_experts(gen, shape)
        label = f"dense {dtype_name(fused.dtype)} experts {shape.label}"
        layer, guard = pack_layer(ops.pack_experts, gate_up, down, shape, device, fused.dtype, label)
        run_layer(ops, layer, guard, gen, fused.dtype, fused.layout == "strided", device, MOE_DISTRIBUTIONS)


@pytest.mark.paged_capability("fused:moe")
@pytest.mark.paged_cases("linear_formats")
def test_moe_packed(conformance: Conformance, linear_case: LinearFormatCase) -> None:
    """Packed experts of one format (and the mixed layers), packed as the engine packs them, through ``moe``."""
    ops, gen, device = conformance.fused_ops(), generator(linear_case.seed ^ 0x30E), conformance.device
    own, q8 = declared(ops, "moe_formats"), declared(ops, "q8_activation_formats") & declared(ops, "moe_formats")
    for i, shape in enumerate(moe_packed_shapes(linear_case.format)):
        gate_up, down = packed_experts(linear_case.format, shape)
        formats = (gate_up.format.name, down.format.name)
        mine = all(f in own for f in formats)
        packer = ops.pack_experts if mine else REFERENCE.pack_experts
        label = f"{'/'.join(dict.fromkeys(formats))} experts {shape.label}" + ("" if mine else ", reference-packed")
        rounds = (mine and formats[0] in q8, mine and formats[1] in q8)
        layer, guard = pack_layer(packer, gate_up, down, shape, device, linear_case.dtype, label, rounds)
        run_layer(ops, layer, guard, gen, linear_case.dtype, i % 2 == 1, device, MOE_DISTRIBUTIONS[:2])


def given_routing(
    gen: torch.Generator, tokens: int, shape: MoEShape, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A routing computed elsewhere, as a model's own router hands it over: ``top_k`` distinct experts per token in
    no particular order, int64 ids, weights in the activations' dtype that neither sum to one nor come sorted
    (some negative, as a scaled sigmoid router's may not be, but an op must not assume either)."""
    ids = torch.stack([torch.randperm(shape.experts, generator=gen)[: shape.top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, shape.top_k, generator=gen) * 2 - 0.5
    return weights.to(device, dtype), ids.reshape(tokens, shape.top_k).to(device)


@pytest.mark.paged_capability("fused:moe")
@pytest.mark.paged_cases("fused")
def test_experts_given_routing(conformance: Conformance, fused: FusedCase) -> None:
    """``experts`` (a routing computed elsewhere: a model's router, expert parallelism's rows) against the reference's,
    dense experts and the first packed format the backend declares, 1, 7 and 130 tokens, contiguous and views."""
    ops, gen, device = conformance.fused_ops(), generator(fused.seed ^ 0xE0E), conformance.device
    q8 = declared(ops, "q8_activation_formats") & declared(ops, "moe_formats")
    for kind, shape, packed in _trace_layers(ops, conformance, fused):
        reference = REFERENCE.pack_experts(*(fresh(w, torch.device("cpu")) for w in (packed.gate_up, packed.down)))
        routing = routing_of(shape)
        layer = Layer(packed, reference, routing, f"{kind} experts {shape.label}", (kind in q8, kind in q8))
        for tokens in (1, 7, 130):
            x = randn(gen, tokens, shape.hidden).to(device, fused.dtype)
            weights, ids = given_routing(gen, tokens, shape, fused.dtype, device)
            if fused.layout == "strided":
                x, weights = column_view(x), column_view(weights)
            what = f"experts(x [{tokens}, {shape.hidden}], {layer.label}, a given routing)"
            x_ref, w_ref, ids_ref = x.cpu().contiguous(), weights.cpu().contiguous(), ids.cpu()
            want = REFERENCE.experts(x_ref, w_ref, ids_ref, reference, routing.activation)
            guard = Untouched({"x": x, "weights": weights, "ids": ids})
            got = ops.experts(x, weights, ids, packed, routing.activation)
            guard.check(what)
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != (tokens, shape.hidden):
                raise AssertionError(f"{what} returned {getattr(got, 'shape', type(got).__name__)}")
            if got.dtype != fused.dtype or got.device != x.device:
                raise AssertionError(f"{what}: {dtype_name(got.dtype)} on {got.device}, not x's dtype and device")
            guard.assert_not_aliased([got], what)
            compare(got, want, layer, x_ref, w_ref, ids_ref, fused.dtype, what)


@pytest.mark.paged_capability("fused:moe")
def test_moe_refuses_layouts_it_cannot_serve(conformance: Conformance) -> None:
    """``pack_experts`` refuses ``gate_up`` with an odd ``2I`` and experts whose sizes disagree, and ``moe`` a routing
    over another expert count, each with :class:`~paged_core.api.UnsupportedConfigError`."""
    ops, device = conformance.fused_ops(), conformance.device
    dtype = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d in conformance.caps.dtypes][:1]
    dtype_ = dtype[0] if dtype else torch.float32
    bad = [((4, 47, 32), (4, 32, 24)), ((4, 48, 32), (5, 32, 24)), ((4, 48, 32), (4, 30, 24))]
    for gu, dn in bad:
        try:
            ops.pack_experts(torch.zeros(gu, dtype=dtype_, device=device), torch.zeros(dn, dtype=dtype_, device=device))
        except UnsupportedConfigError:
            continue
        except Exception as exc:
            raise AssertionError(
                f"pack_experts(gate_up {gu}, down {dn}) raised {first_line(exc)}, not an UnsupportedConfigError"
            ) from None
        raise AssertionError(f"pack_experts(gate_up {gu}, down {dn}) accepted a layout whose sizes disagree")
    packed = ops.pack_experts(
        torch.zeros(4, 48, 32, dtype=dtype_, device=device), torch.zeros(4, 32, 24, dtype=dtype_, device=device)
    )
    x, logits = torch.zeros(3, 32, dtype=dtype_, device=device), torch.zeros(3, 8, dtype=dtype_, device=device)
    try:
        ops.moe(x, logits, packed, MoERouting(8, 2, renormalize=True))
    except UnsupportedConfigError:
        return
    except Exception as exc:
        raise AssertionError(
            f"moe over 4 experts with an 8-expert routing raised {first_line(exc)}, not an "
            "UnsupportedConfigError (PackedExperts.check_routing says it)"
        ) from None
    raise AssertionError("moe over 4 experts accepted a routing of 8 experts")


TRACE_TOKENS = 7


def _trace_layers(
    ops: FusedOps, conformance: Conformance, fused: FusedCase
) -> list[tuple[str, MoEShape, PackedExperts]]:
    """The layers traced: dense experts, and the first packed format the backend declares."""
    gen = generator(fused.seed)
    shape = MOE_SHAPES[2]
    gate_up, down = dense_experts(gen, shape)
    layers: list[tuple[str, MoEShape, PackedExperts]] = [
        (
            "dense",
            shape,
            ops.pack_experts(
                fresh(gate_up, conformance.device, fused.dtype), fresh(down, conformance.device, fused.dtype)
            ),
        )
    ]
    own = [f for f in LINEAR_FORMATS if f in declared(ops, "moe_formats")]
    if own:
        shape = moe_packed_shapes(own[0])[0]
        gu, dn = packed_experts(own[0], shape)
        layers.append((own[0], shape, ops.pack_experts(fresh(gu, conformance.device), fresh(dn, conformance.device))))
    return layers


@pytest.mark.paged_capability("fused:moe")
@pytest.mark.paged_cases("fused_trace")
def test_moe_traces(conformance: Conformance, fused: FusedCase) -> None:
    """An overridden ``moe`` compiles as one graph on strided inputs, reads nothing on the host, agrees with eager."""
    ops = conformance.fused_ops()
    if type(ops).moe is FusedOps.moe and type(ops).experts is FusedOps.experts:
        pytest.skip("N/A: moe and experts are the reference's (grouped by expert on the host: eager only)")
    gen = generator(fused.seed ^ 0x7ACE)
    for kind, shape, packed in _trace_layers(ops, conformance, fused):
        routing = routing_of(shape)
        x = column_view(randn(gen, TRACE_TOKENS, shape.hidden).to(conformance.device, fused.dtype))
        logits = router_logits(gen, TRACE_TOKENS, shape.experts, shape.top_k, "random")
        logits = column_view(logits.to(conformance.device, fused.dtype))

        def fn(
            x: torch.Tensor, logits: torch.Tensor, packed: PackedExperts = packed, routing: MoERouting = routing
        ) -> torch.Tensor:
            return ops.moe(x, logits, packed, routing)

        what = f"moe ({kind} experts {shape.label})"
        with HostReads() as reads:
            (eager,) = as_tuple(fn(x, logits), what, 1)
        if reads.seen:
            raise AssertionError(
                f"{what} reads tensors on the host ({', '.join(dict.fromkeys(reads.seen))}): a "
                "device graph would freeze the values seen at capture time"
            )
        try:
            compiled = torch.compile(own_entry(fn), backend="aot_eager", fullgraph=True, dynamic=False)(x, logits)
        except Exception as exc:
            raise AssertionError(
                f"{what} does not trace as one graph (torch.compile fullgraph=True, aot_eager): {first_line(exc)}. "
                "An override must be a torch custom op with a fake (meta) implementation and read nothing on the host."
            ) from None
        (got,) = as_tuple(compiled, f"compiled {what}", 1)
        if tuple(got.shape) != tuple(eager.shape) or got.dtype != eager.dtype:
            raise AssertionError(
                f"compiled {what}: {tuple(got.shape)} {got.dtype}, eager gave "
                f"{tuple(eager.shape)} {eager.dtype} (does the fake implementation agree?)"
            )
        assert_within(got, eager, 1e-5, 1e-5, f"compiled {what} vs eager")


@pytest.mark.paged_capability("fused:moe")
@pytest.mark.paged_cases("batch_invariance_linear")
def test_moe_batch_invariant(conformance: Conformance, invariance_linear: InvarianceLinearCase) -> None:
    """Experts of a kind in ``batch_invariant_moe``: each token in any call has its bits alone."""
    ops, case, device = conformance.fused_ops(), invariance_linear, conformance.device
    if case.kind not in declared(ops, "batch_invariant_moe"):
        pytest.skip(f"N/A: {case.kind} is not in {type(ops).__name__}.batch_invariant_moe")
    shape, gen = MOE_INVARIANCE_SHAPE, generator(case.seed ^ 0x30E)
    gate_up, down = (fresh(w, device) for w in kind_experts(case.kind, shape, gen))
    own = case.kind not in LINEAR_FORMATS or case.kind in declared(ops, "moe_formats")
    packed = (ops.pack_experts if own else REFERENCE.pack_experts)(gate_up, down)
    routing = routing_of(shape)
    x = randn(gen, INVARIANCE_POOL, shape.hidden).to(device, case.dtype)
    logits = router_logits(gen, INVARIANCE_POOL, shape.experts, shape.top_k, "random").to(device, case.dtype)
    what = f"moe {case.kind} experts {shape.label}, x {dtype_name(case.dtype)}"

    def call(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = rows.to(device)
        return (ops.moe(x[rows], logits[rows], packed, routing),)

    RowCheck(what, call, case.seed).run()


@pytest.mark.paged_capability("capability_check")
def test_moe_declaration(conformance: Conformance) -> None:
    """``moe_formats`` is a frozenset of known packed formats; ``batch_invariant_moe`` one of known weight kinds."""
    check_declaration(conformance.fused_ops())
