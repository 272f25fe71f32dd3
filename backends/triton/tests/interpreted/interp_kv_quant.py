"""Quantized KV caches (int8, fp8 e4m3fn and e5m2) in the write and attention kernels (interpreter only).

The write kernel must store exactly the bytes of :func:`paged_core.api.quantize_kv` (values and float16
scales); attention over such a cache must equal the reference over :func:`paged_core.api.dequantize_kv`
of it, in the compute dtype.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import QUANTIZED, TOL, Outcome, attend, run_case, write

from paged_core.api import AttentionSpec, Availability, build_attention_metadata, dequantize_kv, quantize_kv
from paged_core.testing import ReferenceBackend
from paged_triton import launch
from paged_triton.backend import QUANTIZED_KV, TritonBackend
from paged_triton.tiles import INTERPRET_TILES_ENV


class _QuantizedTriton(TritonBackend):
    """A vendor over the shared kernels that opts into every quantized KV dtype (as paged-backend-rocm)."""

    name = "quantized-triton"
    quantized_kv_dtypes = QUANTIZED_KV

    def __init__(self) -> None:
        super().__init__("cpu")
        self._load_kernels()

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, "test", "cpu")


def _special_vectors(kv_dtype: torch.dtype, head: int) -> torch.Tensor:
    """Vectors whose rounding is easy to get wrong: ties (to even), values rounding up into the next binade,
    fp8 subnormals and their ties, tiny negatives that round to -0.0, the scale clamps, all zeros."""
    qmax = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}[kv_dtype]
    # With max|x| == QMAX the scale is exactly 1, so x / scale is x itself: each entry is the tie it names.
    ties = [0.5, 1.5, 2.5, -0.5, -2.5, 3.5, 8.5, 9.5, 9.0, 11.0, 15.5, 30.0, 31.0, 126.5, -126.5, 0.0]
    ties += [2.0**-10, 3 * 2.0**-10, 2.0**-17, 3 * 2.0**-17, -(2.0**-30), -0.0, 2.0**-9, 2.0**-16]
    rows = torch.zeros(5, head)
    rows[0, : len(ties)] = torch.tensor(ties)
    rows[0, -1] = qmax
    rows[1] = torch.linspace(-1.0, 1.0, head) * 1e-12  # max|x| / QMAX below 2**-24: the scale's lower clamp
    rows[2] = torch.linspace(-1.0, 1.0, head) * 3e38  # above 65504 * QMAX for int8: the scale's upper clamp
    rows[3] = 0.0
    rows[4] = torch.linspace(-3.0, 5.0, head)
    return rows


@pytest.mark.parametrize("kv_dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_write_is_quantize_kv(kv_dtype: torch.dtype, dtype: torch.dtype) -> None:
    """Random and special vectors of each input dtype are stored byte for byte as ``quantize_kv``; a padding
    slot (-1) writes nothing (values or scale)."""
    head, block = 64, 16
    gen = torch.Generator().manual_seed(3)
    special = _special_vectors(kv_dtype, head)
    if dtype != torch.float32:
        special = special.clamp(-6e4, 6e4)  # representable in fp16 (and the clamps still hit for int8)
    rand = torch.randn(6, head, generator=gen) * torch.logspace(-6, 4, 6)[:, None]
    x = torch.cat([special, rand]).to(dtype)
    tokens = x.shape[0] // 2
    key, value = x[:tokens].reshape(tokens, 1, head), x[tokens : 2 * tokens].reshape(tokens, 1, head)
    spec = AttentionSpec(1, 1, head)
    cache = ReferenceBackend("cpu").allocate_kv_cache(2, block, spec, kv_dtype)
    cache.view(torch.uint8).fill_(0xA5)  # slots the kernel must leave alone keep this pattern
    slots = torch.arange(tokens)
    slots[2] = -1
    launch.write_kv(key, value, cache, slots)
    stored = cache.view(2, -1, 1, head + 2)
    for plane, src in ((0, key), (1, value)):
        want = quantize_kv(src, kv_dtype)
        for t in range(tokens):
            got = stored[plane, t].view(torch.uint8)
            if t == 2:
                assert bool((got == 0xA5).all()), "the padding slot was written"
            else:
                assert torch.equal(got, want[t].view(torch.uint8)), (plane, t, got, want[t].view(torch.uint8))


@pytest.mark.parametrize("kv_dtype", QUANTIZED, ids=str)
def test_attention_over_quantized_cache(monkeypatch: pytest.MonkeyPatch, kv_dtype: torch.dtype) -> None:
    """A mixed batch (decodes, a chunk over cached context, a fresh prompt) with a compute dtype per cache
    dtype, on AMD/NVIDIA tiles: outputs equal the reference's over the dequantized cache. (The cache is filled
    by ``quantize_kv``: the interpreter takes about 20-40 ms per write program, and
    :func:`test_write_is_quantize_kv` checks the write kernel's bytes.)"""
    monkeypatch.setenv(INTERPRET_TILES_ENV, "cdna")
    dtype = {torch.int8: torch.bfloat16, torch.float8_e4m3fn: torch.float16, torch.float8_e5m2: torch.float32}
    run_case(dtype[kv_dtype], kv_dtype, 4, 2, 96, 32, [1, 1, 5, 12], [70, 3, 40, 12], kernel_write=False).check()


def test_copy_blocks_moves_values_and_scales() -> None:
    """copy_blocks on an int8 cache copies whole vectors, scales included."""
    spec = AttentionSpec(2, 2, 64)
    cache = ReferenceBackend("cpu").allocate_kv_cache(4, 16, spec, torch.int8)
    md = build_attention_metadata([3], [3], [[1]], 16)
    kv = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(5))
    write(kv, -kv, cache, md)
    launch.copy_blocks([cache], torch.tensor([[1, 3]]))
    assert torch.equal(cache[:, 3], cache[:, 1]) and bool(cache[:, 3].ne(0).any())


def test_backend_serves_quantized_caches() -> None:
    """A TritonBackend that declares the quantized dtypes allocates the default layout (head size + 2), passes
    its input checks, stores with the write kernel and attends with the spec's window and soft cap."""
    kv_dtype = torch.int8
    backend = _QuantizedTriton()
    caps = backend.capabilities()
    assert set(QUANTIZED) <= caps.effective_kv_cache_dtypes and caps.sliding_window and caps.logits_soft_cap
    spec = AttentionSpec(4, 2, 64, sliding_window=9, logits_soft_cap=20.0)
    seq_lens, query_lens = [18, 6], [1, 6]
    md = build_attention_metadata(query_lens, seq_lens, [[1, 2], [3]], 16)
    cache = backend.allocate_kv_cache(4, 16, spec, kv_dtype)
    assert tuple(cache.shape) == (2, 4, 16, 2, 66) and cache.dtype == kv_dtype
    gen = torch.Generator().manual_seed(11)
    whole = build_attention_metadata(seq_lens, seq_lens, [[1, 2], [3]], 16)
    k, v = torch.randn(24, 2, 64, generator=gen), torch.randn(24, 2, 64, generator=gen)
    backend.write_kv(k, v, cache, whole)
    q = torch.randn(7, 4, 64, generator=gen)
    got = backend.attention(q, cache, md, spec)
    assert torch.equal(got, attend(q, cache, md, spec, None))
    want = ReferenceBackend("cpu").attention(q, dequantize_kv(cache), md, spec)
    Outcome(got, want, TOL[torch.float32]).check()


def test_xpu_tiles_fp8_decode_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Intel's tiles over an fp8 cache with a long decode split into partitions."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, "xpu")
    run_case(torch.float16, torch.float8_e4m3fn, 8, 1, 64, 64, [1, 1], [600, 40], kernel_write=False).check()
