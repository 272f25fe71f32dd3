"""Quantized caches hold rotated keys and values (runner/kv_rotation.py); other caches see the vectors as they are."""

from __future__ import annotations

import torch

from paged_core.api import AttentionSpec, FusedOps, build_attention_metadata
from paged_core.reference import ReferenceBackend
from paged_core.runner.kv_rotation import rotating

SPEC = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=64)
BLOCK = 16


def _recording() -> tuple[list[tuple[torch.Tensor, ...]], object]:
    seen: list[tuple[torch.Tensor, ...]] = []

    def forward(q, k, v, cache, md, spec):  # type: ignore[no-untyped-def]
        seen.append((q, k, v))
        return q * 2

    return seen, forward


def test_an_unquantized_cache_gets_the_vectors_as_they_are() -> None:
    seen, forward = _recording()
    q, k, v = torch.randn(3, 4, 64), torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = rotating(forward, FusedOps())(q, k, v, torch.zeros(1, dtype=dtype), None, SPEC)  # type: ignore[arg-type]
        assert seen[-1][0] is q and seen[-1][1] is k and seen[-1][2] is v
        torch.testing.assert_close(out, q * 2, rtol=0, atol=0)


def test_a_quantized_cache_gets_rotated_vectors_and_the_output_is_rotated_back() -> None:
    ops = FusedOps()
    q, k, v = torch.randn(5, 4, 64), torch.randn(5, 2, 64), torch.randn(5, 2, 64)
    for dtype in (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2):
        seen, forward = _recording()
        out = rotating(forward, ops)(q, k, v, torch.zeros(1, dtype=dtype), None, SPEC)  # type: ignore[arg-type]
        rq, rk, rv = seen[0]
        assert not torch.allclose(rk, k, atol=1e-3)  # really rotated
        # Scores are unchanged (the rotation is orthogonal) and norms are kept.
        torch.testing.assert_close(rq[:, :2] @ rk[:, :2].transpose(-1, -2), q[:, :2] @ k[:, :2].transpose(-1, -2))
        torch.testing.assert_close(rv.norm(dim=-1), v.norm(dim=-1))
        # The output over rotated values is rotated back: here the backend returned 2 * rotated q.
        torch.testing.assert_close(out, q * 2, atol=1e-5, rtol=1e-5)


def _prefill(backend: ReferenceBackend, attend, q, k, v, kv_dtype: torch.dtype) -> torch.Tensor:  # type: ignore[no-untyped-def]
    tokens = q.shape[0]
    blocks = -(-tokens // BLOCK)
    cache = backend.allocate_kv_cache(blocks + 1, BLOCK, SPEC, kv_dtype)
    md = build_attention_metadata([tokens], [tokens], [list(range(1, blocks + 1))], BLOCK)
    out: torch.Tensor = attend(q, k, v, cache, md, SPEC)
    return out


def test_rotation_shrinks_the_error_of_an_fp8_cache_when_energy_sits_in_a_few_channels() -> None:
    """Keys and queries sharing a few large channels (as real models' do): the rotated fp8 cache's output is
    closer to the fp32 cache's than the unrotated one's, and both stay close."""
    gen = torch.Generator().manual_seed(0)
    tokens = 96
    q = torch.randn(tokens, 4, 64, generator=gen)
    k = torch.randn(tokens, 2, 64, generator=gen)
    v = torch.randn(tokens, 2, 64, generator=gen)
    for t in (q, k, v):
        t[..., :3] *= 25.0  # outlier channels: the scale follows them, the other channels round coarsely
    backend = ReferenceBackend("cpu")
    exact = _prefill(backend, backend.forward, q, k, v, torch.float32)
    plain = _prefill(backend, backend.forward, q, k, v, torch.float8_e4m3fn)
    rotated = _prefill(backend, rotating(backend.forward, backend.fused_ops()), q, k, v, torch.float8_e4m3fn)
    err_plain = (plain - exact).norm() / exact.norm()
    err_rotated = (rotated - exact).norm() / exact.norm()
    assert err_rotated < 0.7 * err_plain, (float(err_rotated), float(err_plain))
    assert err_rotated < 0.05
