"""Running a batch through a backend and comparing outputs with a clear failure message."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from paged_conformance.batch import Batch, make_batch
from paged_conformance.grid import Case, dtype_name
from paged_conformance.integrity import assert_spare_blocks_untouched, assert_unchanged, snapshot
from paged_conformance.layouts import strided
from paged_conformance.oracle import dense_attention, reference_backend_cls
from paged_core.api import AttentionBackend, AttentionSpec, is_quantized_kv

if TYPE_CHECKING:
    from paged_conformance.session import Conformance

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-4, 2e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (1e-2, 1e-2),
}
"""``(atol, rtol)`` per dtype, applied against a float32 (or reference) result."""


def tolerance(batch: Batch) -> tuple[float, float]:
    """The looser of the compute dtype's and a float KV-cache dtype's tolerances.

    Keys and values are exactly representable in a float cache dtype, but a kernel may also compute in it. A
    quantized cache (int8, fp8) gets the compute dtype's: the oracle reads the same quantized values (the
    contract's rule), and dequantized they are exact in float32 (an 8-bit value times a float16 scale).
    """
    a, r = TOLERANCES.get(batch.dtype, (1e-2, 1e-2))
    if is_quantized_kv(batch.kv_dtype):
        return a, r
    ka, kr = TOLERANCES.get(batch.kv_dtype, (1e-1, 1e-1))
    return max(a, ka), max(r, kr)


@dataclass
class Step:
    """What one run of a batch left behind: the output rows and the KV cache."""

    output: torch.Tensor
    kv_cache: torch.Tensor


LAYERS = 2
"""Layers per checked step: one ``prepare``, then ``forward`` per layer with its own cache and q/k/v."""


def run_layers(
    backend: AttentionBackend,
    layers: list[Batch],
    spec: AttentionSpec | None = None,
    pad: int = 0,
    fill: torch.Tensor | None = None,
) -> list[Step]:
    """Run one step of several layers: store each layer's context, then ``prepare`` once and ``forward`` each.

    The layers share row shapes and block tables (so one metadata serves
    all, as in a model). After every call the metadata must be bit-identical
    to a copy taken before; without ``fill``, blocks no row uses must still
    read as zeros afterwards. ``pad`` appends padding tokens (slot -1);
    ``fill`` pre-fills each cache (instead of zeros) so stray writes show.
    q/k/v reach the backend in the first batch's layout.
    """
    first = layers[0]
    spec = spec or first.spec
    device = backend.device
    caches = []
    for batch in layers:
        cache = backend.allocate_kv_cache(batch.num_blocks, batch.block_size, spec, batch.kv_dtype)
        want = tuple(backend.kv_cache_shape_for(batch.num_blocks, batch.block_size, spec, batch.kv_dtype))
        if tuple(cache.shape) != want:  # the KV budget counts blocks with kv_cache_shape_for: it must be the truth
            raise AssertionError(f"allocate_kv_cache gave shape {tuple(cache.shape)}, kv_cache_shape_for says {want}")
        if fill is not None:
            cache.copy_(fill.to(device=cache.device, dtype=cache.dtype))
        caches.append(cache)
    contexts = [batch.context_step(device) for batch in layers]
    if contexts[0] is not None:
        md = contexts[0][0]
        before = snapshot(md)
        backend.prepare(md)
        for layer, (ctx, cache) in enumerate(zip(contexts, caches, strict=True)):
            assert ctx is not None
            k, v = strided(first.layout, ctx[1], ctx[2])
            backend.write_kv(k, v, cache, md)
            assert_unchanged(md, before, f"layer {layer}: write_kv (storing the context)")
    md = first.metadata(device, pad)
    before = snapshot(md)
    backend.prepare(md)
    assert_unchanged(md, before, "prepare")
    steps = []
    for layer, (batch, cache) in enumerate(zip(layers, caches, strict=True)):
        q, k, v = strided(first.layout, *batch.step_tensors(device, pad))
        out = backend.forward(q, k, v, cache, md, spec)
        assert_unchanged(md, before, f"layer {layer}: forward")
        steps.append(Step(out[: md.num_actual_tokens], cache))
    if fill is None:
        assert_spare_blocks_untouched(backend, caches, first.spare_blocks(), first.block_size, spec, first.dtype)
    return steps


def run_batch(
    backend: AttentionBackend,
    batch: Batch,
    spec: AttentionSpec | None = None,
    pad: int = 0,
    fill: torch.Tensor | None = None,
) -> Step:
    """:func:`run_layers` for a single layer."""
    return run_layers(backend, [batch], spec, pad, fill)[0]


def expected(oracle: str, batch: Batch, device: torch.device, spec: AttentionSpec | None = None) -> torch.Tensor:
    """The oracle's output rows for ``batch`` (on the CPU).

    The oracle always gets contiguous inputs and, for a float KV-cache dtype, a cache in the compute dtype: the
    batch's keys and values are exactly representable in it, so storing them there loses nothing. A quantized
    cache (int8, fp8) is the reference's in the same dtype, so both sides hold the same quantized values (the
    dense oracle quantizes them by the same rule).
    """
    if oracle == "dense":
        return dense_attention(batch, spec)
    ref_cls = reference_backend_cls()
    if ref_cls is None:
        raise RuntimeError("the reference oracle is not available in this paged-core")
    kv = batch.kv_dtype if is_quantized_kv(batch.kv_dtype) else batch.dtype
    plain = dataclasses.replace(batch, kv_dtype=kv, layout="contiguous")
    return run_batch(ref_cls(device), plain, spec).output.cpu()


def check_layers(
    conformance: Conformance, case: Case, spec: AttentionSpec | None = None, what: str = "attention output vs oracle"
) -> None:
    """Run ``case`` over :data:`LAYERS` layers in one step and compare every layer with the oracle."""
    layers = [make_batch(case, spec=spec, layer=i) for i in range(LAYERS)]
    spec = spec or layers[0].spec
    conformance.caps.check(spec, case.dtype, case.block_size, kv_cache_dtype=case.cache_dtype)  # declared: accepted
    steps = run_layers(conformance.backend(), layers, spec)
    for layer, (batch, step) in enumerate(zip(layers, steps, strict=True)):
        assert step.output.dtype == case.dtype, (
            f"layer {layer}: attention returned {step.output.dtype}, expected the query's {case.dtype}"
        )
        assert_close(step.output, conformance.expected(batch, spec), batch, f"layer {layer}: {what}")


def row_of(batch: Batch, token: int) -> int:
    """Which row a flattened token index belongs to."""
    start = 0
    for b, q in enumerate(batch.query_lens):
        if token < start + q:
            return b
        start += q
    return len(batch.query_lens)


def assert_close(
    actual: torch.Tensor, want: torch.Tensor, batch: Batch, what: str = "attention output vs oracle"
) -> None:
    """Fail with the worst token, its row and position when ``actual`` differs from ``want`` beyond tolerance."""
    if tuple(actual.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(want.shape)}")
    atol, rtol = tolerance(batch)
    a, w = actual.detach().float().cpu(), want.float().cpu()
    bad = ~torch.isclose(a, w, atol=atol, rtol=rtol)
    if not bad.any():
        return
    err = (a - w).abs().nan_to_num(float("inf"))
    token, head, _ = divmod_index(int(err.argmax()), err.shape)
    b = row_of(batch, token)
    first = sum(batch.query_lens[:b])
    pos = batch.seq_lens[b] - batch.query_lens[b] + token - first
    raise AssertionError(
        f"{what} mismatch: max abs error {float(err.max()):.3g} at token {token} "
        f"(row {b}, position {pos}, query_len {batch.query_lens[b]}, seq_len {batch.seq_lens[b]}, head {head}); "
        f"{int(bad.sum())}/{bad.numel()} elements outside atol={atol}, rtol={rtol} ({dtype_name(batch.dtype)}, "
        f"KV cache {dtype_name(batch.kv_dtype)})"
    )


def divmod_index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """Unravel a flat index into ``shape``."""
    out = []
    for dim in reversed(shape):
        flat, r = divmod(flat, dim)
        out.append(r)
    return tuple(reversed(out))
