"""The declared envelope beyond the conformance grid, on IPEX's real CPU ops (skipped where they cannot load).

The conformance suite sweeps head sizes 64/80/128/256 and GQA ratios 1/4/8; the backend declares more
(every head size in ``HEAD_SIZES``, ratios 1-16, e.g. SmolLM2's 3), so this sweeps the rest against the
reference backend. ``backends/xpu/ci/ipex_conformance.sh`` runs it in the torch-2.8 environment.
"""

from __future__ import annotations

import pytest
import torch

from paged_backend_xpu import ipex_library
from paged_backend_xpu.ipex_backend import GQA_RATIOS, HEAD_SIZES, IpexBackend
from paged_core.api import AttentionSpec, build_attention_metadata
from paged_core.testing import ReferenceBackend

_MISSING = ipex_library.missing_reason()
if _MISSING is not None:
    pytest.skip(f"IPEX's op library: {_MISSING}", allow_module_level=True)
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}
GRID_HEADS, GRID_RATIOS = {64, 80, 128, 256}, {1, 4, 8}


def _attend(backend: object, spec: AttentionSpec, dtype: torch.dtype, block_size: int) -> torch.Tensor:
    """Decodes, a fresh prefill and a prefill over cache (context written first), all at ``block_size``."""
    assert isinstance(backend, (IpexBackend, ReferenceBackend))
    gen = torch.Generator().manual_seed(spec.head_size * 131 + spec.num_heads)
    query_lens, seq_lens = [1, 1, 5, 9], [3, block_size + 5, 5, 2 * block_size + 7]
    tables, next_block = [], 1
    for seq_len in seq_lens:
        count = -(-seq_len // block_size)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    cache = backend.allocate_kv_cache(next_block, block_size, spec, dtype)
    kv = (spec.num_kv_heads, spec.head_size)
    context = [s - q for s, q in zip(seq_lens, query_lens, strict=True)]
    rows = [i for i, c in enumerate(context) if c]
    prior = build_attention_metadata(
        [context[i] for i in rows], [context[i] for i in rows], [tables[i] for i in rows], block_size
    )
    backend.write_kv(
        torch.randn(sum(context), *kv, generator=gen).to(dtype),
        torch.randn(sum(context), *kv, generator=gen).to(dtype),
        cache,
        prior,
    )
    meta = build_attention_metadata(query_lens, seq_lens, tables, block_size)
    n = sum(query_lens)
    q = torch.randn(n, spec.num_heads, spec.head_size, generator=gen).to(dtype)
    k, v = (torch.randn(n, *kv, generator=gen).to(dtype) for _ in range(2))
    backend.write_kv(k, v, cache, meta)
    return backend.attention(q, cache, meta, spec).float()


CASES = [(h, 2, 2) for h in sorted(HEAD_SIZES - GRID_HEADS)] + [(64, r, 2) for r in sorted(GQA_RATIOS - GRID_RATIOS)]


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(("head_size", "gqa", "kv_heads"), CASES, ids=[f"h{h}-gqa{g}" for h, g, _ in CASES])
def test_beyond_the_grid(head_size: int, gqa: int, kv_heads: int, dtype: torch.dtype) -> None:
    spec = AttentionSpec(gqa * kv_heads, kv_heads, head_size)
    tol = TOLERANCE[dtype]
    got = _attend(IpexBackend("cpu"), spec, dtype, 16)
    torch.testing.assert_close(got, _attend(ReferenceBackend("cpu"), spec, dtype, 16), atol=tol, rtol=tol)


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_window_and_soft_cap_together(block_size: int) -> None:
    spec = AttentionSpec(12, 4, 96, sliding_window=block_size // 2 + 3, logits_soft_cap=4.0, scale=0.4)
    got = _attend(IpexBackend("cpu"), spec, torch.float32, block_size)
    want = _attend(ReferenceBackend("cpu"), spec, torch.float32, block_size)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
