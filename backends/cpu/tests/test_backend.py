"""The backend as the core sees it: registration, availability, cache ops, tracing, the ISA switch."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from paged_backend_cpu import CpuBackend, layout, ops
from paged_core.api import AttentionSpec, build_attention_metadata
from paged_core.testing import ReferenceBackend, load_registry

from .conftest import make_paged_batch


def test_registered_through_the_entry_point_and_preferred() -> None:
    registry = load_registry(refresh=True)
    assert registry.get("cpu") is CpuBackend
    record = next(r for r in registry.records() if r.name == "cpu")
    assert record.distribution == "paged-backend-cpu"
    assert CpuBackend.priority == 50 > 10  # above the example backend
    avail = CpuBackend.availability()
    if platform.machine().lower() in ("x86_64", "aarch64") and sys.platform.startswith("linux"):
        assert avail.available, avail.reason
        assert ops.isa() in avail.reason


def test_best_isa_is_chosen_by_default() -> None:
    """Without PAGED_CPU_ISA the first (best) supported variant is active, and the flags agree with /proc/cpuinfo."""
    if "PAGED_CPU_ISA" in os.environ:
        pytest.skip("PAGED_CPU_ISA forces a variant in this environment")
    assert ops.isa() == ops.supported_isas()[0]
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    assert ("avx512_bf16" in flags) == ("avx512bf16" in ops.supported_isas())
    assert ("avx2" in flags) == ("avx2" in ops.supported_isas())


def test_env_var_forces_a_variant_at_load() -> None:
    code = "from paged_backend_cpu import ops; print(ops.isa())"
    env = {**os.environ, "PAGED_CPU_ISA": "scalar"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "scalar"


def test_write_kv_skips_padding_and_converts() -> None:
    backend = CpuBackend("cpu")
    spec = AttentionSpec(4, 2, 64)
    cache = backend.allocate_kv_cache(3, 16, spec, torch.bfloat16)
    cache.fill_(7.0)
    md = build_attention_metadata([2], [2], [[1]], 16)
    md.slot_mapping = torch.tensor([16, -1])  # second token is padding
    fused = torch.randn(2, 2 * 2 * 64 + 8)
    key, value = fused[:, :128].view(2, 2, 64), fused[:, 128:256].view(2, 2, 64)  # strided views
    backend.write_kv(key, value, cache, md)
    assert cache.shape == (2, 3, 2, 16, 64)  # [2, blocks, kv heads, block size, head size]
    standard = layout.to_standard(cache)
    assert torch.equal(standard[0, 1, 0], key[0].to(torch.bfloat16))
    assert torch.equal(standard[1, 1, 0], value[0].to(torch.bfloat16))
    untouched = torch.ones_like(standard, dtype=torch.bool)
    untouched[:, 1, 0] = False
    assert bool((standard[untouched] == 7.0).all()), "padding slot -1 or another slot was written"


def test_key_tiles_keep_dimension_pairs_outermost() -> None:
    """Key j's dimensions 2i, 2i+1 of a tile sit at flat offset (i * block_size + j) * 2 (the kernels' contract)."""
    backend = CpuBackend("cpu")
    cache = backend.allocate_kv_cache(2, 32, AttentionSpec(2, 1, 64), torch.float32)
    md = build_attention_metadata([3], [3], [[1]], 32)
    key = torch.arange(3 * 64, dtype=torch.float32).view(3, 1, 64)
    backend.write_kv(key, -key, cache, md)
    tile = cache[0, 1, 0].flatten()
    for j in range(3):
        for d in (0, 1, 2, 63):
            assert tile[(d // 2 * 32 + j) * 2 + d % 2] == key[j, 0, d]
    assert torch.equal(cache[1, 1, 0, :3], -key[:, 0])


def test_layout_round_trip() -> None:
    standard = torch.randn(2, 3, 16, 2, 80)
    assert torch.equal(layout.to_standard(layout.from_standard(standard)), standard)


def test_copy_blocks_in_every_layer() -> None:
    caches = [torch.randn(2, 5, 2, 16, 64) for _ in range(3)]
    before = [c.clone() for c in caches]
    CpuBackend("cpu").copy_blocks(caches, torch.tensor([[1, 3], [1, 4], [2, 0]]))
    for c, b in zip(caches, before, strict=True):
        assert torch.equal(c[:, 3], b[:, 1]) and torch.equal(c[:, 4], b[:, 1]) and torch.equal(c[:, 0], b[:, 2])
        assert torch.equal(c[:, 1:3], b[:, 1:3])


def test_forward_traces_as_one_graph() -> None:
    """The ops have fake implementations: torch.compile(fullgraph=True) traces forward with no graph break."""
    b = make_paged_batch([1, 1, 4], [9, 30, 6], dtype=torch.bfloat16)
    backend = CpuBackend("cpu")
    md = b.metadata
    key = torch.randn(6, 2, 64).to(torch.bfloat16)

    def step(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        return backend.forward(q, k, k, cache, md, b.spec)

    eager_cache = b.cache.clone()
    want = step(b.query, key, eager_cache)
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=False)
    got = compiled(b.query, key, b.cache)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(b.cache, eager_cache), "the traced write_kv did not mutate the cache like the eager one"


def test_forward_matches_reference_end_to_end() -> None:
    """write_kv then attention over a mixed batch, against the reference backend doing the same."""
    b = make_paged_batch([1, 1, 5], [12, 40, 20], dtype=torch.bfloat16)
    k = torch.randn(7, 2, 64).to(torch.bfloat16)
    v = torch.randn(7, 2, 64).to(torch.bfloat16)
    ref_cache = b.standard.clone()
    got = CpuBackend("cpu").forward(b.query, k, v, b.cache, b.metadata, b.spec)
    want = ReferenceBackend("cpu").forward(b.query, k, v, ref_cache, b.metadata, b.spec)
    assert torch.equal(layout.to_standard(b.cache), ref_cache)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)
