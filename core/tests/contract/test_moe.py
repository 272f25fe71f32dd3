"""Routed experts: the routing rule, the expert layouts, and the reference ``FusedOps.moe`` against independent oracles.

The oracle here is a per-token loop in float64 over each token's chosen experts (routing computed apart, in
float64); then transformers' own sparse MoE blocks, and packed experts against their dequantized twins.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, ClassVar

import pytest
import torch

from paged_core.api import (
    LINEAR_FORMATS,
    FusedOps,
    MoERouting,
    PackedExperts,
    QuantizedWeight,
    UnsupportedConfigError,
    route_experts,
)
from paged_core.contract.moe import apply_experts, merge_gate_up, stack_experts
from paged_core.testing import dequantize, random_packed

OPS = FusedOps()
ROUTINGS: dict[str, dict[str, object]] = {
    "mixtral": {"renormalize": True},
    "qwen3": {"renormalize": False},
    "sigmoid": {"scoring": "sigmoid", "renormalize": True, "routed_scaling": 2.5},
    "gelu": {"renormalize": False, "activation": "gelu_tanh", "routed_scaling": 0.75},
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def separated_logits(gen: torch.Generator, tokens: int, experts: int) -> torch.Tensor:
    """Logits whose sorted values lie at least 0.05 apart in every row: no near tie can flip a choice."""
    ranks = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]) if tokens else None
    if ranks is None:
        return torch.zeros(0, experts)
    return (ranks.float() - experts / 2) * (4.0 / experts + 0.05) + 0.02 * torch.rand(tokens, experts, generator=gen)


def experts_weights(gen: torch.Generator, e: int, h: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(e, 2 * i, h, generator=gen) / h**0.5, torch.randn(e, h, i, generator=gen) / i**0.5


def oracle(
    x: torch.Tensor, logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, r: MoERouting
) -> torch.Tensor:
    """Token by token in float64: scores, top-k by sorting, weights, sum of ``w * down(act(gate) * up)``."""
    xd, gu, dn = x.double(), gate_up.double(), down.double()
    inter = dn.shape[2]
    out = torch.zeros(x.shape[0], dn.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        z = logits[t].double()
        scores = (
            torch.exp(z - z.max()) / torch.exp(z - z.max()).sum() if r.scoring == "softmax" else 1 / (1 + torch.exp(-z))
        )
        chosen = sorted(range(r.num_experts), key=lambda e: (-float(scores[e]), e))[: r.top_k]
        w = scores[chosen]
        if r.renormalize:
            w = w / w.sum()
        w = w * r.routed_scaling
        for weight, e in zip(w, chosen, strict=True):
            h = gu[e] @ xd[t]
            g, u = h[:inter], h[inter:]
            if r.activation == "silu":
                a = g / (1 + torch.exp(-g)) * u
            else:
                a = 0.5 * g * (1 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g**3))) * u
            out[t] += weight * (dn[e] @ a)
    return out


def assert_near(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """Within ``tol`` of the largest output (sums of products cancel) and relatively (float32: 2e-5, else 2e-2)."""
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    scale = float(want.abs().max()) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, atol=tol * max(scale, 1.0), rtol=tol)


# --- the routing rule ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_experts": 0, "top_k": 1}, "num_experts"),
        ({"num_experts": 4, "top_k": 5}, "top_k"),
        ({"num_experts": 4, "top_k": 0}, "top_k"),
        ({"num_experts": 4, "top_k": True}, "top_k"),
        ({"num_experts": 4, "top_k": 2, "scoring": "softplus"}, "scoring"),
        ({"num_experts": 4, "top_k": 2, "activation": "relu"}, "activation"),
        ({"num_experts": 4, "top_k": 2, "routed_scaling": 0.0}, "routed_scaling"),
        ({"num_experts": 4, "top_k": 2, "routed_scaling": float("nan")}, "routed_scaling"),
    ],
)
def test_routing_refuses_bad_fields_naming_them(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(UnsupportedConfigError, match=rf"^MoERouting\.{field} = "):
        MoERouting(renormalize=True, **kwargs)  # type: ignore[arg-type]


def test_renormalize_has_no_default_and_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="renormalize"):
        MoERouting(4, 2)  # type: ignore[call-arg]
    with pytest.raises(UnsupportedConfigError, match=r"^MoERouting\.renormalize = 1"):
        MoERouting(4, 2, renormalize=1)  # type: ignore[arg-type]


def test_mixtral_routing_is_the_softmax_over_the_top_k_logits() -> None:
    logits = separated_logits(_gen(1), 9, 8)
    weights, ids = route_experts(logits, MoERouting(8, 2, renormalize=True))
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and weights.shape == ids.shape == (9, 2)
    top = logits.topk(2).indices
    assert torch.equal(ids.long(), top)
    torch.testing.assert_close(weights, logits.gather(1, top).softmax(-1))


def test_sigmoid_scoring_scales_after_renormalizing() -> None:
    logits = separated_logits(_gen(2), 5, 16)
    weights, ids = route_experts(logits, MoERouting(16, 4, "sigmoid", renormalize=True, routed_scaling=2.5))
    s = logits.sigmoid().gather(1, ids.long())
    torch.testing.assert_close(weights, 2.5 * s / s.sum(-1, keepdim=True))
    plain, _ = route_experts(logits, MoERouting(16, 4, "sigmoid", renormalize=False))
    torch.testing.assert_close(plain, s)


def test_ties_go_to_the_lower_expert_id_largest_weight_first() -> None:
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.5, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]], dtype=torch.bfloat16)
    weights, ids = route_experts(logits, MoERouting(6, 3, renormalize=False))
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.equal(weights[1], torch.full((3,), 1 / 6))
    _, ids = route_experts(torch.tensor([[0.1, 0.3, 0.2, 0.9]]), MoERouting(4, 4, renormalize=False))
    assert ids.tolist() == [[3, 1, 2, 0]]


def test_the_choice_is_made_on_the_logits_where_scores_round_equal() -> None:
    logits = torch.tensor([[20.0, 25.0, 0.0, -1.0]])  # both sigmoids round to 1.0 in float32
    weights, ids = route_experts(logits, MoERouting(4, 1, "sigmoid", renormalize=False))
    assert logits.sigmoid()[0, 0] == logits.sigmoid()[0, 1] == 1.0
    assert ids.tolist() == [[1]] and weights.tolist() == [[1.0]]


def test_route_refuses_logits_of_another_expert_count() -> None:
    with pytest.raises(UnsupportedConfigError, match=r"router_logits \(3, 5\): the routing needs \[T, 4\]"):
        route_experts(torch.zeros(3, 5), MoERouting(4, 2, renormalize=True))


# --- the reference op against the float64 per-token loop -------------------------------------------------------------

SHAPES = [(e, k, t) for e, k, t in itertools.product((4, 8, 64), (1, 2, 8), (1, 7, 300)) if k <= e]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("experts", "top_k", "tokens"), SHAPES, ids=[f"e{e}-k{k}-t{t}" for e, k, t in SHAPES])
def test_moe_matches_a_per_token_loop(experts: int, top_k: int, tokens: int, dtype: torch.dtype) -> None:
    name = list(ROUTINGS)[SHAPES.index((experts, top_k, tokens)) % len(ROUTINGS)]
    r = MoERouting(experts, top_k, **ROUTINGS[name])  # type: ignore[arg-type]
    gen = _gen(experts * 1000 + top_k * 10 + tokens)
    h, i = 40, 24
    gate_up, down = (w.to(dtype) for w in experts_weights(gen, experts, h, i))
    x = torch.randn(tokens, h, generator=gen).to(dtype)
    logits = separated_logits(gen, tokens, experts).to(dtype)
    got = OPS.moe(x, logits, OPS.pack_experts(gate_up, down), r)
    assert got.dtype == dtype and got.shape == (tokens, h)
    assert_near(got, oracle(x, logits, gate_up, down, r), dtype)


def test_unchosen_experts_are_never_read() -> None:
    """Experts no token routes to hold NaN: a kernel that multiplies them by a zero weight would return NaN."""
    gen = _gen(3)
    gate_up, down = experts_weights(gen, 8, 32, 16)
    for e in (0, 2, 4, 5, 6, 7):
        gate_up[e], down[e] = float("nan"), float("nan")
    logits = torch.full((11, 8), -10.0)
    logits[:, 1], logits[:, 3] = torch.rand(11, generator=gen), torch.rand(11, generator=gen) + 2
    x = torch.randn(11, 32, generator=gen)
    r = MoERouting(8, 2, renormalize=False)
    got = OPS.moe(x, logits, OPS.pack_experts(gate_up, down), r)
    assert torch.isfinite(got).all()
    assert_near(got, oracle(x, logits, gate_up.nan_to_num(), down.nan_to_num(), r), torch.float32)


@pytest.mark.parametrize("top_k", [1, 2])
def test_every_token_to_one_expert(top_k: int) -> None:
    gen = _gen(4)
    gate_up, down = experts_weights(gen, 4, 32, 16)
    logits = separated_logits(gen, 130, 4)
    logits[:, 2] += 50.0
    x = torch.randn(130, 32, generator=gen)
    r = MoERouting(4, top_k, renormalize=True)
    assert (route_experts(logits, r)[1][:, 0] == 2).all()
    assert_near(
        OPS.moe(x, logits, OPS.pack_experts(gate_up, down), r), oracle(x, logits, gate_up, down, r), torch.float32
    )


def test_strided_inputs_are_read_as_views_and_left_untouched() -> None:
    gen = _gen(5)
    gate_up, down = experts_weights(gen, 8, 32, 16)
    packed = OPS.pack_experts(gate_up, down)
    wide_x = torch.randn(7, 40, generator=gen)
    wide_logits = torch.randn(7, 12, generator=gen)
    x, logits = wide_x[:, 3:35], wide_logits[:, 2:10]
    before = wide_x.clone(), wide_logits.clone()
    r = MoERouting(8, 2, renormalize=True)
    got = OPS.moe(x, logits, packed, r)
    assert torch.equal(wide_x, before[0]) and torch.equal(wide_logits, before[1])
    assert torch.equal(got, OPS.moe(x.contiguous(), logits.contiguous(), packed, r))
    assert got.untyped_storage().data_ptr() != wide_x.untyped_storage().data_ptr()


def test_a_token_s_sum_does_not_depend_on_the_other_tokens_weights() -> None:
    """The weighted sum runs slot by slot per token: a token's output equals its output alone when the expert
    products are the same, here with one expert per slot and as many tokens per expert as alone."""
    gen = _gen(6)
    gate_up, down = experts_weights(gen, 4, 32, 16)
    packed = OPS.pack_experts(gate_up, down)
    logits = separated_logits(gen, 1, 4).repeat(5, 1)
    x = torch.randn(1, 32, generator=gen).repeat(5, 1)
    r = MoERouting(4, 4, renormalize=False)
    got = OPS.moe(x, logits, packed, r)
    assert all(torch.equal(got[i], got[0]) for i in range(5))


# --- packed experts --------------------------------------------------------------------------------------------------


def stacked_packed(fmt: str, e: int, rows: int, k: int, seed: int) -> QuantizedWeight:
    return random_packed(LINEAR_FORMATS[fmt], e * rows, k, _gen(seed), scale=k**-0.5, name=f"{fmt} experts")


@pytest.mark.parametrize("fmt", list(LINEAR_FORMATS))
def test_packed_experts_equal_their_dequantized_twin(fmt: str) -> None:
    e, h, i = 6, 256, 256
    gate_up, down = stacked_packed(fmt, e, 2 * i, h, 7), stacked_packed(fmt, e, h, i, 8)
    packed = OPS.pack_experts(gate_up, down)
    assert (packed.num_experts, packed.hidden_size, packed.intermediate_size) == (e, h, i)
    assert packed.kinds == (fmt, fmt)
    twin = OPS.pack_experts(dequantize(gate_up).view(e, 2 * i, h), dequantize(down).view(e, h, i))
    gen = _gen(9)
    x = torch.randn(9, h, generator=gen)
    logits = separated_logits(gen, 9, e)
    r = MoERouting(e, 2, renormalize=True)
    assert torch.equal(OPS.moe(x, logits, packed, r), OPS.moe(x, logits, twin, r))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_packed_experts_against_the_per_token_loop(fmt: str) -> None:
    e, h, i = 8, 64, 96
    gate_up, down = stacked_packed(fmt, e, 2 * i, h, 10), stacked_packed(fmt, e, h, i, 11)
    gen = _gen(12)
    x = torch.randn(7, h, generator=gen)
    logits = separated_logits(gen, 7, e)
    r = MoERouting(e, 2, renormalize=False)
    got = OPS.moe(x, logits, OPS.pack_experts(gate_up, down), r)
    want = oracle(x, logits, dequantize(gate_up).view(e, 2 * i, h), dequantize(down).view(e, h, i), r)
    assert_near(got, want, torch.float32)


def test_mixed_kinds_and_expert_views() -> None:
    e, h, i = 3, 256, 256
    gate_up, down = stacked_packed("q4_k", e, 2 * i, h, 13), stacked_packed("q6_k", e, h, i, 14)
    packed = PackedExperts(gate_up, down)
    assert packed.kinds == ("q4_k", "q6_k")
    gu1, dn1 = packed.expert(1)
    assert isinstance(gu1, QuantizedWeight) and gu1.shape == (2 * i, h)
    assert isinstance(dn1, QuantizedWeight) and dn1.data.data_ptr() == down.data[h].data_ptr()  # a view, no copy
    dense = PackedExperts(torch.zeros(e, 2 * i, h, dtype=torch.bfloat16), down)
    assert dense.kinds == ("bfloat16", "q6_k") and dense.expert(2)[0].shape == (2 * i, h)
    with pytest.raises(IndexError):
        packed.expert(3)


def test_merge_gate_up_interleaves_gate_then_up_per_expert() -> None:
    e, i, h = 4, 64, 32
    gate, up = stacked_packed("q8_0", e, i, h, 15), stacked_packed("q8_0", e, i, h, 16)
    merged = merge_gate_up(gate, up, e)
    assert isinstance(merged, QuantizedWeight)
    want = torch.cat((dequantize(gate).view(e, i, h), dequantize(up).view(e, i, h)), 1)
    assert torch.equal(dequantize(merged).view(e, 2 * i, h), want)
    gi, ui = random_packed(LINEAR_FORMATS["int8"], e * i, h, _gen(17)), random_packed(LINEAR_FORMATS["int8"], e * i, h)
    merged_int8 = merge_gate_up(gi, ui, e)
    assert isinstance(merged_int8, QuantizedWeight)
    assert torch.equal(
        dequantize(merged_int8).view(e, 2 * i, h),
        torch.cat((dequantize(gi).view(e, i, h), dequantize(ui).view(e, i, h)), 1),
    )
    dense_gate, dense_up = torch.randn(e, i, h), torch.randn(e, i, h)
    assert torch.equal(merge_gate_up(dense_gate, dense_up, e)[:, i:], dense_up)
    with pytest.raises(UnsupportedConfigError, match="cannot merge"):
        merge_gate_up(gate, stacked_packed("q4_0", e, i, h, 18), e)


def test_stack_experts_of_consecutive_rows_is_a_view() -> None:
    whole = stacked_packed("q4_0", 3, 64, 32, 19)
    parts = [whole.rows(64 * j, 64 * (j + 1)) for j in range(3)]
    stacked = stack_experts(parts)
    assert isinstance(stacked, QuantizedWeight) and stacked.data.data_ptr() == whole.data.data_ptr()
    dense = stack_experts([torch.ones(2, 3), torch.zeros(2, 3)])
    assert isinstance(dense, torch.Tensor) and dense.shape == (2, 2, 3)
    with pytest.raises(UnsupportedConfigError):
        stack_experts([torch.ones(64, 32), parts[0]])


# --- bad layouts -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate_up", "down", "fragment"),
    [
        ((4, 47, 32), (4, 32, 24), "2I = 47 is odd"),
        ((4, 46, 32), (4, 32, 24), "gate_up has 46 rows per expert, 48 expected"),
        ((4, 48, 32), (5, 32, 24), "gate_up holds 4 experts, down 5"),
        ((4, 48, 32), (4, 30, 24), "down has 30 rows per expert, 32 expected"),
        ((48, 32), (4, 32, 24), "3-D"),
    ],
)
def test_layouts_that_do_not_fit_are_refused_naming_the_shapes(
    gate_up: tuple[int, ...], down: tuple[int, ...], fragment: str
) -> None:
    pattern = re.escape(f"gate_up {gate_up} and down {down}: ") + ".*" + re.escape(fragment)
    with pytest.raises(UnsupportedConfigError, match=pattern):
        OPS.pack_experts(torch.zeros(gate_up), torch.zeros(down))


def test_packed_rows_that_do_not_fit_are_refused() -> None:
    gate_up = stacked_packed("q8_0", 4, 2 * 32, 64, 20)
    with pytest.raises(UnsupportedConfigError, match="down's 96 rows are no multiple of 64"):
        PackedExperts(gate_up, stacked_packed("q8_0", 3, 32, 32, 21))
    with pytest.raises(UnsupportedConfigError, match="gate_up's 256 rows are no multiple of 96"):
        PackedExperts(gate_up, stacked_packed("int8", 4, 64, 48, 22))
    with pytest.raises(UnsupportedConfigError, match="gate_up holds 4 experts, down 2"):
        PackedExperts(gate_up, stacked_packed("q8_0", 2, 64, 32, 23))


def test_moe_refuses_a_routing_or_inputs_of_other_shapes() -> None:
    packed = OPS.pack_experts(torch.zeros(4, 48, 32), torch.zeros(4, 32, 24))
    x, logits = torch.zeros(3, 32), torch.zeros(3, 4)
    with pytest.raises(
        UnsupportedConfigError, match=r"gate_up \(4, 48, 32\), down \(4, 32, 24\)\) hold 4 experts; .* 8"
    ):
        OPS.moe(x, torch.zeros(3, 8), packed, MoERouting(8, 2, renormalize=True))
    r = MoERouting(4, 2, renormalize=True)
    with pytest.raises(UnsupportedConfigError, match=r"moe x \(3, 16\): the experts need \[T, 32\]"):
        OPS.moe(torch.zeros(3, 16), logits, packed, r)
    with pytest.raises(UnsupportedConfigError, match=r"router_logits \(2, 4\): .* need \(3, 4\)"):
        OPS.moe(x, logits[:2], packed, r)


def test_zero_tokens_give_an_empty_result() -> None:
    packed = OPS.pack_experts(torch.randn(4, 48, 32), torch.randn(4, 32, 24))
    out = OPS.moe(
        torch.zeros(0, 32, dtype=torch.bfloat16), torch.zeros(0, 4), packed, MoERouting(4, 2, renormalize=True)
    )
    assert out.shape == (0, 32) and out.dtype == torch.bfloat16


# --- the experts op -------------------------------------------------------------------------------------------------


def test_moe_routes_then_calls_experts_and_experts_is_the_reference_arithmetic() -> None:
    """The base ``moe`` is ``route_experts`` then ``experts``: a backend overriding ``experts`` gets ``moe``."""
    gen = torch.Generator().manual_seed(7)
    packed = PackedExperts(torch.randn(4, 48, 32, generator=gen), torch.randn(4, 32, 24, generator=gen))
    routing = MoERouting(4, 2, renormalize=False)
    x, logits = torch.randn(9, 32, generator=gen), torch.randn(9, 4, generator=gen)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Spy(FusedOps):
        def experts(
            self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts, activation: Any
        ) -> torch.Tensor:
            seen.append((weights, ids))
            return super().experts(x, weights, ids, experts, activation) * 2

    out = Spy().moe(x, logits, packed, routing)
    weights, ids = route_experts(logits, routing)
    assert len(seen) == 1 and torch.equal(seen[0][0], weights) and torch.equal(seen[0][1], ids)
    assert torch.equal(out, 2 * apply_experts(x, weights, ids, packed))
    assert torch.equal(FusedOps().experts(x, weights, ids, packed), apply_experts(x, weights, ids, packed))


# --- declarations ----------------------------------------------------------------------------------------------------


def test_declarations_default_and_an_override_without_one_promises_nothing() -> None:
    assert FusedOps.moe_formats == frozenset(LINEAR_FORMATS) and FusedOps.batch_invariant_moe == frozenset()

    class OwnMoe(FusedOps):
        def moe(
            self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
        ) -> torch.Tensor:
            return super().moe(x, router_logits, experts, routing)

    class Declares(FusedOps):
        moe_formats: ClassVar[frozenset[str]] = frozenset({"q8_0"})
        batch_invariant_moe: ClassVar[frozenset[str]] = frozenset({"float32"})

        def pack_experts(
            self, gate_up: torch.Tensor | QuantizedWeight, down: torch.Tensor | QuantizedWeight
        ) -> PackedExperts:
            return super().pack_experts(gate_up, down)

    class Child(Declares):
        def moe(
            self, x: torch.Tensor, router_logits: torch.Tensor, experts: PackedExperts, routing: MoERouting
        ) -> torch.Tensor:
            return super().moe(x, router_logits, experts, routing)

    class OwnExperts(FusedOps):
        def experts(
            self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PackedExperts, activation: Any
        ) -> torch.Tensor:
            return super().experts(x, weights, ids, experts, activation)

    assert OwnExperts.moe_formats == frozenset() and OwnExperts.batch_invariant_moe == frozenset()
    assert OwnMoe.moe_formats == frozenset() and OwnMoe.batch_invariant_moe == frozenset()
    assert OwnMoe.linear_formats == FusedOps.linear_formats  # the linear declarations are not touched
    assert Declares.moe_formats == frozenset({"q8_0"}) and Child.batch_invariant_moe == frozenset({"float32"})


# --- transformers' own blocks ----------------------------------------------------------------------------------------


def _block(family: str, norm_topk: bool) -> tuple[torch.nn.Module, MoERouting]:
    h, i, e, k = 32, 24, 8, 2
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        cfg = Qwen3MoeConfig(
            hidden_size=h, moe_intermediate_size=i, num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm_topk
        )
        return Qwen3MoeSparseMoeBlock(cfg), MoERouting(e, k, renormalize=norm_topk)
    if family == "olmoe":
        from transformers import OlmoeConfig
        from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock

        cfg = OlmoeConfig(
            hidden_size=h, intermediate_size=i, num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm_topk
        )
        return OlmoeSparseMoeBlock(cfg), MoERouting(e, k, renormalize=norm_topk)
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=h, intermediate_size=i, num_local_experts=e, num_experts_per_tok=k)
    return MixtralSparseMoeBlock(cfg), MoERouting(e, k, renormalize=True)


@pytest.mark.parametrize(
    ("family", "norm_topk"), [("mixtral", True), ("qwen3_moe", True), ("qwen3_moe", False), ("olmoe", False)]
)
def test_transformers_sparse_moe_blocks(family: str, norm_topk: bool) -> None:
    torch.manual_seed(0)
    block, routing = _block(family, norm_topk)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    block.eval()
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        want = block(x)
        want = want[0] if isinstance(want, tuple) else want
        flat = x.reshape(-1, 32)
        logits = torch.nn.functional.linear(flat, block.gate.weight)
        packed = OPS.pack_experts(block.experts.gate_up_proj.detach(), block.experts.down_proj.detach())
        got = OPS.moe(flat, logits, packed, routing)
    torch.testing.assert_close(got, want.reshape(-1, 32), atol=1e-5, rtol=1e-5)
