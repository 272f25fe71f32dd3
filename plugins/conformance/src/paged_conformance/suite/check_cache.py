"""The KV cache: shape hook, writes (round trip, padding slots) and block copies.

The cache layout is the backend's own, so everything but the shape is
checked by observation: what attention reads back, and whether two runs leave
bit-identical caches.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from paged_conformance.batch import independent_pairs, make_batch
from paged_conformance.grid import NUM_KV_HEADS, Case, base_config, declared_dtypes, declared_kv_dtypes, dtype_name
from paged_conformance.harness import assert_close, run_batch
from paged_conformance.quantized_kv import code_mismatch, default_layout, probe_vectors, value_mismatch
from paged_conformance.session import Conformance
from paged_core.api import build_attention_metadata, quantize_kv


def _case(conformance: Conformance, block_size: int, kind: str = "mixed", length: str = "block+1") -> Case:
    base = base_config(conformance.caps)
    if base is None:
        pytest.skip("N/A: no head size or GQA ratio the suite knows is declared")
    head, gqa = base
    return Case(declared_dtypes(conformance.caps)[0], head, block_size, gqa, kind, length)


@pytest.mark.paged_capability("kv_cache_shape")
@pytest.mark.paged_cases("block_sizes")
def test_kv_cache_shape(conformance: Conformance, block_size: int) -> None:
    """``allocate_kv_cache`` returns exactly ``kv_cache_shape``, in the asked dtype (each declared KV dtype too)."""
    case = _case(conformance, block_size)
    backend = conformance.backend()
    spec = make_batch(case).spec
    for num_blocks in (1, 7):
        want = tuple(backend.kv_cache_shape(num_blocks, block_size, NUM_KV_HEADS, case.head_size))
        cache = backend.allocate_kv_cache(num_blocks, block_size, spec, case.dtype)
        assert tuple(cache.shape) == want, f"allocate_kv_cache shape {tuple(cache.shape)} != kv_cache_shape {want}"
        assert cache.dtype == case.dtype, f"allocate_kv_cache dtype {cache.dtype} != {case.dtype}"
        assert cache.device.type == backend.device.type, f"cache on {cache.device}, backend on {backend.device}"
    assert backend.kv_cache_shape(1, block_size, NUM_KV_HEADS, case.head_size) != want, "shape ignores num_blocks"
    for kv_dtype in declared_kv_dtypes(conformance.caps):
        cache = backend.allocate_kv_cache(7, block_size, spec, kv_dtype)
        assert cache.dtype == kv_dtype, f"allocate_kv_cache in a declared KV dtype gave {cache.dtype}, not {kv_dtype}"


@pytest.mark.paged_capability("padding")
@pytest.mark.paged_cases("block_sizes")
def test_padding_slots_never_written(conformance: Conformance, block_size: int) -> None:
    """Trailing tokens with slot -1 leave the cache bit-identical and do not change real rows' outputs."""
    batch = make_batch(_case(conformance, block_size))
    backend = conformance.backend()
    noise = torch.randn(backend.kv_cache_shape(batch.num_blocks, block_size, NUM_KV_HEADS, batch.spec.head_size))
    plain, padded = (run_batch(backend, batch, pad=pad, fill=noise) for pad in (0, 5))
    differ = int((plain.kv_cache != padded.kv_cache).sum())
    assert differ == 0, f"padding slots (-1) were written: {differ} KV-cache elements differ from the unpadded run"
    assert_close(padded.output, conformance.expected(batch), batch, "output with 5 padding tokens")


def _write_in_chunks(conformance: Conformance, block_size: int) -> None:
    """Store one row's context in uneven chunks (1 token, a block, the rest), then decode over it."""
    n = 2 * block_size + 3
    case = _case(conformance, block_size, "decode", "long")
    batch = make_batch(case, rows=[(1, n)])
    backend = conformance.backend()
    cache = backend.allocate_kv_cache(batch.num_blocks, block_size, batch.spec, case.dtype)
    bounds = [0, 1, 1 + block_size, n - 1]
    for lo, hi in itertools.pairwise(bounds):
        md = build_attention_metadata([hi - lo], [hi], batch.block_tables, block_size, backend.device)
        k, v = batch.keys[0][lo:hi].to(backend.device), batch.values[0][lo:hi].to(backend.device)
        backend.prepare(md)
        backend.write_kv(k, v, cache, md)
    md = batch.metadata(backend.device)
    q, k, v = batch.step_tensors(backend.device)
    backend.prepare(md)
    out = backend.forward(q, k, v, cache, md, batch.spec)
    assert_close(out[: md.num_actual_tokens], conformance.expected(batch), batch, "decode over chunk-written KV")


@pytest.mark.paged_capability("write_kv")
@pytest.mark.paged_cases("block_sizes")
def test_write_kv_round_trip(conformance: Conformance, block_size: int) -> None:
    """Keys and values written over several steps read back through attention exactly as the oracle sees them."""
    _write_in_chunks(conformance, block_size)


@pytest.mark.paged_capability("copy_blocks")
@pytest.mark.paged_cases("block_sizes")
def test_copy_blocks(conformance: Conformance, block_size: int) -> None:
    """One ``copy_blocks`` call with several pairs (a source copied twice) in three layers; copies read back right.

    Attention over the copies (both variants of the last block) and over the
    untouched sources must match the oracle in every layer.
    """
    n = 2 * block_size + 1  # three blocks, the last one partly filled
    case = _case(conformance, block_size, "decode", "long")
    layers = [make_batch(case, rows=[(1, n)], layer=i) for i in range(3)]  # one seed: shared block tables
    src = layers[0].block_tables[0]
    spare = layers[0].spare_blocks()
    assert len(spare) >= len(src) + 1, "internal: the batch has too few spare blocks"
    # The last source goes to two destinations, as a fork of a partly filled block does.
    pairs = independent_pairs([*zip(src, spare, strict=False), (src[-1], spare[len(src)])])
    backend = conformance.backend()
    caches = []
    for batch in layers:
        cache = backend.allocate_kv_cache(batch.num_blocks, block_size, batch.spec, case.dtype)
        md = build_attention_metadata([n], [n], batch.block_tables, block_size, backend.device)
        backend.prepare(md)
        backend.write_kv(batch.keys[0].to(backend.device), batch.values[0].to(backend.device), cache, md)
        caches.append(cache)
    backend.copy_blocks(caches, torch.tensor(pairs, dtype=torch.int64, device=backend.device))
    tables = {
        "copied": spare[: len(src)],
        "second copy of the last": [*spare[: len(src) - 1], spare[len(src)]],
        "source": src,
    }
    for layer, (batch, cache) in enumerate(zip(layers, caches, strict=True)):
        want = conformance.expected(batch)
        for label, table in tables.items():
            moved = dataclasses.replace(batch, block_tables=[table])
            md = moved.metadata(backend.device)
            q = torch.cat(moved.queries).to(backend.device)
            backend.prepare(md)
            out = backend.attention(q, cache, md, moved.spec)
            assert_close(out[: md.num_actual_tokens], want, moved, f"layer {layer}, attention over the {label} blocks")


@pytest.mark.paged_capability("write_kv")
@pytest.mark.paged_cases("quantized_kv")
def test_quantized_write_follows_the_rule(conformance: Conformance, kv_dtype: torch.dtype) -> None:
    """A quantized cache (int8, fp8) holds each written vector as ``quantize_kv`` stores it (per token-head float16
    scale, the contract's rounding), for vectors from 1e-3 to 1e3 with outliers and all-zero heads.

    In the default layout every stored byte of keys and values is compared (written in two steps over
    shuffled blocks); in any layout, values are read back through attention (a row of one key returns its
    value). Keys of other layouts are checked through attention by the grid's quantized cases.
    """
    if kv_dtype not in conformance.caps.effective_kv_cache_dtypes:
        pytest.skip(f"N/A: KV dtype {dtype_name(kv_dtype)} not declared")
    case = _case(conformance, conformance.caps.block_sizes[0])
    backend, bs, spec = conformance.backend(), case.block_size, make_batch(case).spec
    heads, size = spec.num_kv_heads, spec.head_size
    name = dtype_name(kv_dtype)
    if default_layout(backend):
        n = 2 * bs + 3
        keys, values = (probe_vectors(n, heads, size, seed).to(case.dtype) for seed in (1, 2))
        table = (torch.randperm(4, generator=torch.Generator().manual_seed(3)) + 1).tolist()[:3]
        cache = backend.allocate_kv_cache(5, bs, spec, kv_dtype)
        for lo, hi in ((0, bs + 1), (bs + 1, n)):  # a prefill chunk, then one continuing mid-block
            md = build_attention_metadata([hi - lo], [hi], [table], bs, backend.device)
            backend.prepare(md)
            backend.write_kv(keys[lo:hi].to(backend.device), values[lo:hi].to(backend.device), cache, md)
        for part, x in ((0, keys), (1, values)):
            stored = cache[part, table].reshape(-1, heads, size + 2)[:n].cpu()
            what = f"{'keys' if part == 0 else 'values'} stored in a {name} cache"
            problem = code_mismatch(stored, quantize_kv(x, kv_dtype), what)
            assert problem is None, problem
    # Any layout: m rows of one token each, every token alone in a block; each row's output is its value.
    m = 24
    values = probe_vectors(m, heads, size, 4).to(case.dtype)
    blocks = (torch.randperm(m + 2, generator=torch.Generator().manual_seed(5)) + 1).tolist()[:m]
    cache = backend.allocate_kv_cache(m + 3, bs, spec, kv_dtype)
    md = build_attention_metadata([1] * m, [1] * m, [[b] for b in blocks], bs, backend.device)
    keys = probe_vectors(m, heads, size, 6).to(case.dtype)
    backend.prepare(md)
    backend.write_kv(keys.to(backend.device), values.to(backend.device), cache, md)
    query = torch.randn(m, spec.num_heads, size, generator=torch.Generator().manual_seed(7)).to(case.dtype)
    out = backend.attention(query.to(backend.device), cache, md, spec)[:m].cpu()
    read = out[:, :: spec.gqa_ratio]  # query head h reads KV head h // gqa_ratio
    problem = value_mismatch(read, quantize_kv(values, kv_dtype), case.dtype, f"values read from a {name} cache")
    assert problem is None, problem
