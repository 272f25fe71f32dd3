"""The IPEX tier's own logic, without IPEX: availability, refusals, and every call it makes into IPEX's ops.

The main environment cannot hold IPEX (it pins torch 2.8), so ``torch.ops.torch_ipex`` is replaced by a
stand-in implementing the semantics recorded for IPEX 2.8.0's CPU ops: HND caches ``[blocks, kv_heads,
block, head]``, ``reshape_and_cache`` writing every slot it gets (here: refusing ``-1`` instead of
corrupting memory), and ``flash_attn_varlen_func`` with a bottom-right causal mask, window ``(left,
right)`` and ``softcap = -1`` for "off", refusing a query whose dtype is not the cache's. The oracle is
:class:`paged_core.testing.ReferenceBackend`. The real ops go through the conformance suite in
``ci/ipex_conformance.sh`` (and ``test_ipex_envelope.py`` there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from paged_backend_xpu import ipex_backend, ipex_library
from paged_backend_xpu.ipex_backend import IpexBackend
from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    GraphSupport,
    PagedError,
    UnsupportedConfigError,
    build_attention_metadata,
)
from paged_core.testing import ReferenceBackend


class StandInIpexOps:
    """``torch.ops.torch_ipex``'s two paged ops in plain torch, checking arguments as strictly as IPEX's schema."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def reshape_and_cache(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        assert len(args) == 8, "schema: (key, value, key_cache, value_cache, slot_mapping, str, float, float)"
        key, value, key_cache, value_cache, slots, kv_dtype, k_scale, v_scale = args
        self.calls.append(("reshape_and_cache", args))
        assert (kv_dtype, k_scale, v_scale) == ("auto", 1.0, 1.0)
        assert slots.dtype == torch.int32, "IPEX takes int32 slots"
        assert key.dtype == key_cache.dtype and value.dtype == value_cache.dtype
        num_blocks, _, block_size, _ = key_cache.shape
        # IPEX does not skip -1 (it writes out of bounds); the stand-in refuses what would corrupt memory.
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_blocks * block_size):
            raise AssertionError(f"slot out of range reached reshape_and_cache: {slots.tolist()}")
        for t, slot in enumerate(slots.tolist()):
            key_cache[slot // block_size, :, slot % block_size] = key[t]
            value_cache[slot // block_size, :, slot % block_size] = value[t]
        return key_cache, value_cache

    def flash_attn_varlen_func(self, *args: Any) -> torch.Tensor:
        assert len(args) == 18
        (
            out,
            q,
            k_cache,
            v_cache,
            cu_q,
            cu_kv,
            max_q,
            max_kv,
            scale,
            causal,
            block_table,
            alibi,
            left,
            right,
            kv_dtype,
            k_scale,
            v_scale,
            softcap,
        ) = args
        self.calls.append(("flash_attn_varlen_func", args))
        if q.dtype != k_cache.dtype:
            raise RuntimeError(f"expected scalar type {k_cache.dtype} but found {q.dtype}")
        assert out.dtype == q.dtype and out.shape == q.shape
        assert cu_q.dtype == cu_kv.dtype == block_table.dtype == torch.int32
        assert isinstance(max_q, int) and isinstance(max_kv, int) and isinstance(scale, float)
        assert causal is True and alibi is None and (kv_dtype, k_scale, v_scale) == ("auto", 1.0, 1.0)
        assert isinstance(left, int) and isinstance(right, int) and isinstance(softcap, float)
        block_size, kv_heads, head_size = k_cache.shape[2], k_cache.shape[1], k_cache.shape[3]
        group = q.shape[1] // kv_heads
        for b in range(cu_q.shape[0] - 1):
            q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
            k_len = int(cu_kv[b + 1] - cu_kv[b])
            assert q1 - q0 <= max_q and k_len <= max_kv
            blocks = block_table[b, : -(-k_len // block_size)].long()
            keys = k_cache[blocks].permute(0, 2, 1, 3).reshape(-1, kv_heads, head_size)[:k_len].float()
            values = v_cache[blocks].permute(0, 2, 1, 3).reshape(-1, kv_heads, head_size)[:k_len].float()
            keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), keys) * scale
            if softcap > 0:
                scores = softcap * torch.tanh(scores / softcap)
            pos = torch.arange(k_len - (q1 - q0), k_len)[:, None]  # bottom-right aligned query positions
            key_pos = torch.arange(k_len)[None, :]
            visible = key_pos <= pos + (right if right >= 0 else k_len)
            visible &= key_pos <= pos  # causal
            if left >= 0:
                visible &= key_pos >= pos - left
            scores = scores.masked_fill(~visible, float("-inf"))
            out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(out.dtype)
        result: torch.Tensor = out
        return result


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> StandInIpexOps:
    ops = StandInIpexOps()
    monkeypatch.setattr(ipex_library, "ops", lambda: ops)
    return ops


def _batch(block_size: int = 16) -> tuple[list[int], list[int], list[list[int]]]:
    """Two decodes, then a fresh prefill and a prefill over 30 cached tokens (rows not block aligned)."""
    query_lens, seq_lens = [1, 1, 9, 12], [5, 37, 9, 42]
    tables, next_block = [], 1
    for seq_len in seq_lens:
        count = -(-seq_len // block_size)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    return query_lens, seq_lens, tables


def _run(
    backend: Any, spec: AttentionSpec, dtype: torch.dtype, kv_dtype: torch.dtype, seed: int = 0, pad: int = 0
) -> torch.Tensor:
    """Cache every row's earlier tokens, then write this step's and attend; ``pad`` padding tokens at the end."""
    gen = torch.Generator().manual_seed(seed)
    query_lens, seq_lens, tables = _batch()
    cache = backend.allocate_kv_cache(32, 16, spec, kv_dtype)
    context = [s - q for s, q in zip(seq_lens, query_lens, strict=True)]
    rows = [i for i, c in enumerate(context) if c > 0]
    if rows:
        prior = build_attention_metadata(
            [context[i] for i in rows], [context[i] for i in rows], [tables[i] for i in rows], 16
        )
        n = sum(context)
        k, v = (torch.randn(n, spec.num_kv_heads, spec.head_size, generator=gen) for _ in range(2))
        backend.write_kv(k.to(dtype), v.to(dtype), cache, prior)
    meta = build_attention_metadata(query_lens, seq_lens, tables, 16)
    n = sum(query_lens)
    q = torch.randn(n + pad, spec.num_heads, spec.head_size, generator=gen).to(dtype)
    k, v = (torch.randn(n + pad, spec.num_kv_heads, spec.head_size, generator=gen).to(dtype) for _ in range(2))
    if pad:
        meta = dataclasses.replace(meta, slot_mapping=torch.cat([meta.slot_mapping, torch.full((pad,), -1)]))
    backend.write_kv(k, v, cache, meta)
    out: torch.Tensor = backend.attention(q, cache, meta, spec)
    assert out.dtype == dtype and out.shape == q.shape
    return out[:n]


SPEC = AttentionSpec(num_heads=8, num_kv_heads=2, head_size=64)


# availability and construction -----------------------------------------------------------------------------


def test_unavailable_without_ipex_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ipex_library, "package_dir", lambda: None)
    ipex_library._load.cache_clear()
    try:
        got = IpexBackend.availability()
        assert not got.available and got.device == "cpu"
        assert "intel-extension-for-pytorch is not installed" in got.reason
        assert "pip install torch==2.8.0 intel-extension-for-pytorch==2.8.0" in got.reason
        with pytest.raises(PagedError, match=r"intel-extension-for-pytorch==2\.8\.0"):
            IpexBackend("cpu")
    finally:
        ipex_library._load.cache_clear()


def test_available_on_cpu_when_the_library_loads(stand_in: StandInIpexOps) -> None:
    got = IpexBackend.availability()
    assert got.available and got.device == "cpu" and "CPU kernels" in got.reason
    assert IpexBackend().device == torch.device("cpu")


def test_refuses_other_devices(stand_in: StandInIpexOps) -> None:
    with pytest.raises(PagedError, match=r"cpu tensors.*xpu backend"):
        IpexBackend("xpu")


def test_identity_and_envelope() -> None:
    assert (IpexBackend.name, IpexBackend.api_version) == ("xpu-ipex", 1)
    assert IpexBackend.priority < 50  # never chosen over the cpu backend on a CPU
    caps = IpexBackend.capabilities()
    assert caps.graph_support == GraphSupport.NEVER
    assert caps.sliding_window and caps.logits_soft_cap
    assert caps.block_sizes == (16, 32, 64)
    assert caps.effective_kv_cache_dtypes == caps.dtypes == {torch.float32, torch.bfloat16, torch.float16}


def test_capability_check_names_what_would_work() -> None:
    caps = IpexBackend.capabilities()
    with pytest.raises(UnsupportedConfigError, match=r"head_size 40 not supported \(supported: \[32, 64"):
        caps.check(AttentionSpec(8, 2, 40), torch.float32, 16)
    with pytest.raises(UnsupportedConfigError, match=r"block_size 8 not supported \(supported: \[16, 32, 64\]\)"):
        caps.check(SPEC, torch.float32, 8)
    with pytest.raises(UnsupportedConfigError, match=r"kv_cache_dtype torch\.float8_e4m3fn not supported"):
        caps.check(SPEC, torch.bfloat16, 16, torch.float8_e4m3fn)
    with pytest.raises(UnsupportedConfigError, match="GQA ratio 32 not supported"):
        caps.check(AttentionSpec(32, 1, 64), torch.float32, 16)


# layout and refusals ---------------------------------------------------------------------------------------


def test_cache_is_head_major_and_writes_land_there(stand_in: StandInIpexOps) -> None:
    backend = IpexBackend("cpu")
    assert backend.kv_cache_shape(10, 16, 2, 64) == (2, 10, 2, 16, 64)
    cache = backend.allocate_kv_cache(4, 16, SPEC, torch.float32)
    meta = build_attention_metadata([3], [3], [[2]], 16)
    key = torch.randn(3, 2, 64)
    backend.write_kv(key, -key, cache, meta)
    assert torch.equal(cache[0, 2, :, 1], key[1]) and torch.equal(cache[1, 2, :, 2], -key[2])
    assert cache[:, :2].abs().sum() == 0 and cache[:, 3].abs().sum() == 0


def test_refusals_name_the_problem(stand_in: StandInIpexOps) -> None:
    backend = IpexBackend("cpu")
    meta = build_attention_metadata([2], [2], [[1]], 16)
    hnd = backend.allocate_kv_cache(4, 16, SPEC, torch.float32)
    nhd = torch.zeros(2, 4, 16, 2, 64)
    with pytest.raises(PagedError, match=r"block size 2 .*HND"):
        backend.write_kv(torch.randn(2, 2, 64), torch.randn(2, 2, 64), nhd, meta)
    with pytest.raises(PagedError, match=r"must be \[2, 2, 64\]"):
        backend.write_kv(torch.randn(2, 2, 32), torch.randn(2, 2, 32), hnd, meta)
    with pytest.raises(PagedError, match="slot_mapping must be int64"):
        backend.write_kv(
            torch.randn(2, 2, 64),
            torch.randn(2, 2, 64),
            hnd,
            dataclasses.replace(meta, slot_mapping=meta.slot_mapping.int()),
        )
    with pytest.raises(PagedError, match="cache has only 64 slots"):
        backend.write_kv(
            torch.randn(2, 2, 64),
            torch.randn(2, 2, 64),
            hnd,
            dataclasses.replace(meta, slot_mapping=torch.tensor([0, 64])),
        )
    with pytest.raises(PagedError, match=r"query \(2, 4, 64\) must be \[T, 8, 64\]"):
        backend.attention(torch.randn(2, 4, 64), hnd, meta, SPEC)
    with pytest.raises(PagedError, match="do not match the spec"):
        backend.attention(torch.randn(2, 8, 64), hnd, meta, AttentionSpec(8, 1, 64))
    cache40 = torch.zeros(2, 4, 2, 16, 40)
    with pytest.raises(UnsupportedConfigError, match="head_size 40 not supported"):
        backend.attention(torch.randn(2, 8, 40), cache40, meta, AttentionSpec(8, 2, 40))
    assert not stand_in.calls  # nothing reached IPEX


# attention against the reference ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "dtype", "kv_dtype", "tol"),
    [
        (SPEC, torch.float32, torch.float32, 1e-5),
        (AttentionSpec(6, 3, 80, scale=0.3), torch.float32, torch.float32, 1e-5),
        (AttentionSpec(8, 2, 64, sliding_window=7), torch.float32, torch.float32, 1e-5),
        (AttentionSpec(8, 2, 64, logits_soft_cap=2.0, scale=0.5), torch.float32, torch.float32, 1e-5),
        (SPEC, torch.float32, torch.bfloat16, 3e-2),
        (SPEC, torch.float16, torch.float32, 2e-3),
    ],
    ids=["plain", "gqa3-scale", "window", "softcap", "fp32-q-bf16-cache", "fp16-q-fp32-cache"],
)
def test_matches_reference(
    stand_in: StandInIpexOps, spec: AttentionSpec, dtype: torch.dtype, kv_dtype: torch.dtype, tol: float
) -> None:
    got = _run(IpexBackend("cpu"), spec, dtype, kv_dtype)
    want = _run(ReferenceBackend("cpu"), spec, dtype, kv_dtype)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    varlen = [args for name, args in stand_in.calls if name == "flash_attn_varlen_func"]
    assert len(varlen) == 1  # decode and prefill rows in one call
    assert varlen[0][1].dtype == kv_dtype  # the query went in the cache dtype


def test_window_and_softcap_arguments(stand_in: StandInIpexOps) -> None:
    assert ipex_backend.window_sides(None) == (-1, -1)
    assert ipex_backend.window_sides(7) == (6, 0)
    assert ipex_backend.softcap_value(None) == -1.0 and ipex_backend.softcap_value(2) == 2.0
    _run(
        IpexBackend("cpu"), AttentionSpec(8, 2, 64, sliding_window=7, logits_soft_cap=3.0), torch.float32, torch.float32
    )
    (args,) = [a for name, a in stand_in.calls if name == "flash_attn_varlen_func"]
    assert args[12:14] == (6, 0) and args[17] == 3.0
    assert args[8] == pytest.approx(64**-0.5)
    assert args[5].tolist() == [0, 5, 42, 51, 93]  # cu_seqlens_kv = [0, cumsum(seq_lens)]
    assert (args[6], args[7]) == (12, 42)  # max_query_len, max_seq_len


@pytest.mark.parametrize(
    ("target", "wrong"),
    [("window_sides", lambda w: (-1, -1) if w is None else (w, 0)), ("softcap_value", lambda c: -1.0)],
    ids=["window-off-by-one", "softcap-dropped"],
)
def test_a_wrong_convention_is_caught(
    stand_in: StandInIpexOps, monkeypatch: pytest.MonkeyPatch, target: str, wrong: Any
) -> None:
    """Mutation check: the comparison above fails when a convention is off (so it can fail at all)."""
    spec = AttentionSpec(8, 2, 64, sliding_window=7, logits_soft_cap=1.0, scale=1.0)
    want = _run(ReferenceBackend("cpu"), spec, torch.float32, torch.float32)
    torch.testing.assert_close(_run(IpexBackend("cpu"), spec, torch.float32, torch.float32), want)
    monkeypatch.setattr(ipex_backend, target, wrong)
    got = _run(IpexBackend("cpu"), spec, torch.float32, torch.float32)
    assert (got - want).abs().max() > 1e-3


def test_padding_never_reaches_ipex(stand_in: StandInIpexOps) -> None:
    got = _run(IpexBackend("cpu"), SPEC, torch.float32, torch.float32, pad=5)
    want = _run(ReferenceBackend("cpu"), SPEC, torch.float32, torch.float32, pad=5)
    torch.testing.assert_close(got, want)
    writes = [args for name, args in stand_in.calls if name == "reshape_and_cache"]
    assert [w[4].shape[0] for w in writes] == [70, 23]  # context, then the 23 real tokens of 28
    (varlen,) = [args for name, args in stand_in.calls if name == "flash_attn_varlen_func"]
    assert varlen[1].shape[0] == 23


def test_negative_slots_inside_the_live_rows_are_skipped(stand_in: StandInIpexOps) -> None:
    backend = IpexBackend("cpu")
    cache = backend.allocate_kv_cache(4, 16, SPEC, torch.float32)
    meta = build_attention_metadata([3], [3], [[1]], 16)
    meta = dataclasses.replace(meta, slot_mapping=torch.tensor([16, -1, 18]))
    key = torch.randn(3, 2, 64)
    backend.write_kv(key, key, cache, meta)
    assert torch.equal(cache[0, 1, :, 2], key[2]) and cache[0, 1, :, 1].abs().sum() == 0


def test_copy_blocks_matches_reference(stand_in: StandInIpexOps) -> None:
    backend = IpexBackend("cpu")
    caches = [torch.randn(backend.kv_cache_shape(6, 16, 2, 64)) for _ in range(2)]
    want = [c.clone() for c in caches]
    pairs = torch.tensor([[1, 4], [2, 5]])
    backend.copy_blocks(caches, pairs)
    ReferenceBackend("cpu").copy_blocks(want, pairs)  # block ids index dim 1 in either layout
    assert all(torch.equal(a, b) for a, b in zip(caches, want, strict=True))
    with pytest.raises(PagedError, match="out of range for 6 blocks"):
        backend.copy_blocks(caches, torch.tensor([[1, 6]]))
    with pytest.raises(PagedError, match=r"must be \[N, 2\]"):
        backend.copy_blocks(caches, torch.tensor([1, 2]))


def test_metadata_is_left_untouched(stand_in: StandInIpexOps) -> None:
    backend = IpexBackend("cpu")
    query_lens, seq_lens, tables = _batch()
    meta: AttentionMetadata = build_attention_metadata(query_lens, seq_lens, tables, 16)
    before = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
    snapshot = {k: v.clone() for k, v in before.items() if isinstance(v, torch.Tensor)}
    cache = backend.allocate_kv_cache(32, 16, SPEC, torch.float32)
    n = sum(query_lens)
    backend.forward(torch.randn(n, 8, 64), torch.randn(n, 2, 64), torch.randn(n, 2, 64), cache, meta, SPEC)
    assert all(torch.equal(getattr(meta, k), v) for k, v in snapshot.items())
