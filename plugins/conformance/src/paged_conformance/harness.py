"""Running a batch through a backend and comparing outputs with a clear failure message."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_conformance.batch import Batch
from paged_conformance.grid import dtype_name
from paged_conformance.oracle import dense_attention, reference_backend_cls
from paged_core.api import AttentionBackend, AttentionSpec

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-4, 2e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (1e-2, 1e-2),
}
"""``(atol, rtol)`` per dtype, applied against a float32 (or reference) result."""


@dataclass
class Step:
    """What one run of a batch left behind: the output rows and the KV cache."""

    output: torch.Tensor
    kv_cache: torch.Tensor


def run_batch(
    backend: AttentionBackend,
    batch: Batch,
    spec: AttentionSpec | None = None,
    pad: int = 0,
    fill: torch.Tensor | None = None,
) -> Step:
    """Store the batch's context, then run its step through ``prepare`` and ``forward``.

    ``pad`` appends padding tokens (slot -1); ``fill`` pre-fills the cache
    (instead of zeros) so stray writes show.
    """
    spec = spec or batch.spec
    device = backend.device
    cache = backend.allocate_kv_cache(batch.num_blocks, batch.block_size, spec, batch.dtype)
    if fill is not None:
        cache.copy_(fill.to(device=cache.device, dtype=cache.dtype))
    ctx = batch.context_step(device)
    if ctx is not None:
        md, k, v = ctx
        backend.prepare(md)
        backend.write_kv(k, v, cache, md)
    md = batch.metadata(device, pad)
    q, k, v = batch.step_tensors(device, pad)
    backend.prepare(md)
    out = backend.forward(q, k, v, cache, md, spec)
    return Step(out[: md.num_actual_tokens], cache)


def expected(oracle: str, batch: Batch, device: torch.device, spec: AttentionSpec | None = None) -> torch.Tensor:
    """The oracle's output rows for ``batch`` (on the CPU)."""
    if oracle == "dense":
        return dense_attention(batch, spec)
    ref_cls = reference_backend_cls()
    if ref_cls is None:
        raise RuntimeError("the reference oracle is not available in this paged-core")
    return run_batch(ref_cls(device), batch, spec).output.cpu()


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
    atol, rtol = TOLERANCES.get(batch.dtype, (1e-2, 1e-2))
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
        f"{int(bad.sum())}/{bad.numel()} elements outside atol={atol}, rtol={rtol} ({dtype_name(batch.dtype)})"
    )


def divmod_index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """Unravel a flat index into ``shape``."""
    out = []
    for dim in reversed(shape):
        flat, r = divmod(flat, dim)
        out.append(r)
    return tuple(reversed(out))
