"""FlashAttnBackend on a CPU: availability, the declared envelope, and its plumbing driven through a stand-in.

The stand-in ``flash_attn`` module has the signatures of flash-attn 2.8.3's ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``, enforces the checks of ``flash_api.cpp`` the backend must satisfy (same q/kv
dtype, int32 contiguous block table, pages divisible by 256) and computes with the model of the kernels.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from paged_backend_cuda import environment
from paged_backend_cuda.flash_attn_backend import INSTALL_HINT, FlashAttnBackend
from paged_backend_cuda.flash_attn_model import kvcache_paged_attention, varlen_paged_attention
from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    GraphSupport,
    PagedError,
    UnsupportedConfigError,
    build_attention_metadata,
)
from paged_core.testing import ReferenceBackend

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without an NVIDIA GPU")


@pytest.fixture
def no_flash_attn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``flash_attn`` unfindable, whatever is installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))


@cpu_only
def test_unavailable_here_with_a_reason() -> None:
    """On this CPU-only machine: unavailable, with a reason, on the CPU."""
    avail = FlashAttnBackend.availability()
    assert not avail.available and avail.reason and avail.device == "cpu"


def test_missing_flash_attn_is_the_reason_on_a_gpu_machine(
    monkeypatch: pytest.MonkeyPatch, no_flash_attn: None
) -> None:
    """With a usable GPU but no flash_attn, the reason says how to get it."""
    monkeypatch.setattr(environment, "refusal", lambda: None)
    avail = FlashAttnBackend.availability()
    assert not avail.available and avail.reason == INSTALL_HINT
    assert "pip install flash-attn --no-build-isolation" in avail.reason and "GitHub releases" in avail.reason


def test_construction_without_flash_attn_is_refused(no_flash_attn: None) -> None:
    """Constructing it raises PagedError with the install hint."""
    with pytest.raises(PagedError, match="flash_attn is not importable: PyPI has only its source package"):
        FlashAttnBackend()


@cpu_only
def test_construction_is_refused_here() -> None:
    """Whatever is installed, a CPU-only machine cannot construct it."""
    with pytest.raises(PagedError):
        FlashAttnBackend()


def test_declared_envelope() -> None:
    """bf16/fp16, pages of 256/512, flash-attn 2's head sizes, any GQA, window, soft cap, uniform-decode graphs."""
    caps = FlashAttnBackend.capabilities()
    backend = FlashAttnBackend
    assert (backend.name, backend.priority, backend.api_version) == ("cuda-flash-attn", 55, 1)
    assert caps.dtypes == caps.effective_kv_cache_dtypes == {torch.bfloat16, torch.float16}
    assert caps.block_sizes == (256, 512) and caps.head_sizes == {64, 80, 96, 128, 160, 192, 256}
    assert caps.gqa_ratios is None and caps.sliding_window and caps.logits_soft_cap
    assert caps.graph_support == GraphSupport.UNIFORM_DECODE
    caps.check(AttentionSpec(28, 4, 80, sliding_window=8, logits_soft_cap=30.0), torch.float16, 512, torch.bfloat16)


def test_envelope_refusals_name_the_supported_values() -> None:
    """Block size 16 and fp32 are refused, each naming what is supported."""
    caps = FlashAttnBackend.capabilities()
    with pytest.raises(UnsupportedConfigError, match=r"block_size 16 not supported \(supported: \[256, 512\]\)"):
        caps.check(AttentionSpec(8, 8, 128), torch.bfloat16, 16)
    with pytest.raises(
        UnsupportedConfigError, match=r"dtype torch.float32 not supported \(supported: bfloat16, float16\)"
    ):
        caps.check(AttentionSpec(8, 8, 128), torch.float32, 256)
    with pytest.raises(UnsupportedConfigError, match=r"head_size 48 not supported \(supported: \[64, 80, 96"):
        caps.check(AttentionSpec(8, 8, 48), torch.bfloat16, 256)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor | None) -> None:
    """What flash_api.cpp checks before any paged call."""
    assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype, (
        "query and key must have the same dtype"
    )
    assert block_table is not None and block_table.dtype == torch.int32 and block_table.stride(-1) == 1
    assert k.shape[1] % 256 == 0, "Paged KV cache block size must be divisible by 256"
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1


def fake_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """``flash_attn_varlen_func`` (2.8.3 signature)."""
    _check_inputs(q, k, v, block_table)
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and cu_seqlens_k.is_contiguous()
    assert block_table is not None and block_table.shape[0] == cu_seqlens_q.numel() - 1
    out = varlen_paged_attention(
        q.float(),
        k.float(),
        v.float(),
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        block_table=block_table,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
    )
    return out.to(q.dtype)


def fake_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: torch.Tensor | None = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Any = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> torch.Tensor:
    """``flash_attn_with_kvcache`` (2.8.3 signature), without new keys to append."""
    _check_inputs(q, k_cache, v_cache, block_table)
    assert k is None and v is None and cache_seqlens is not None and cache_seqlens.dtype == torch.int32
    assert block_table is not None and q.dim() == 4 and block_table.shape[0] == q.shape[0]
    out = kvcache_paged_attention(
        q.float(),
        k_cache.float(),
        v_cache.float(),
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
    )
    return out.to(q.dtype)


class Calls:
    """Counts which flash-attn call ran."""

    def __init__(self) -> None:
        self.varlen = 0
        self.kvcache = 0


def cpu_backend(calls: Calls, version: str = "2.8.3") -> FlashAttnBackend:
    """The backend bound to the stand-in module on the CPU (its constructor insists on a GPU)."""

    def varlen(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.varlen += 1
        return fake_varlen(*args, **kwargs)

    def kvcache(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.kvcache += 1
        return fake_kvcache(*args, **kwargs)

    backend = FlashAttnBackend.__new__(FlashAttnBackend)
    backend.device = torch.device("cpu")
    backend._start(SimpleNamespace(__version__=version, flash_attn_varlen_func=varlen, flash_attn_with_kvcache=kvcache))
    return backend


def make_step(
    rows: list[tuple[int, int]], spec: AttentionSpec, block_size: int = 256, pad_to: int = 0, seed: int = 0
) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
    """Metadata (padded with one-token rows in block 0 up to ``pad_to``), a bf16 cache and a query."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-seq // block_size) for _, seq in rows]
    num_blocks = sum(needed) + 2
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = [free[sum(needed[:b]) : sum(needed[: b + 1])] for b in range(len(rows))]
    pad = max(pad_to - len(rows), 0)
    md = build_attention_metadata(
        [q for q, _ in rows] + [1] * pad,
        [s for _, s in rows] + [1] * pad,
        tables + [[0]] * pad,
        block_size,
        max_blocks_per_seq=max(needed) + 1,
    )
    cache = torch.randn(2, num_blocks, block_size, spec.num_kv_heads, spec.head_size, generator=gen).bfloat16()
    query = torch.randn(md.num_tokens, spec.num_heads, spec.head_size, generator=gen)
    return md, cache, query


def reference(query: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, spec: AttentionSpec) -> torch.Tensor:
    return ReferenceBackend().attention(query.to(cache.dtype), cache, md, spec).to(query.dtype)


def test_mixed_step_runs_one_varlen_call_and_casts_the_query() -> None:
    """Decode and prefill rows in one varlen call; an fp16 query over a bf16 cache comes back fp16."""
    spec = AttentionSpec(8, 2, 64, sliding_window=40, logits_soft_cap=10.0)
    md, cache, query = make_step([(1, 300), (1, 9), (20, 280)], spec)
    calls = Calls()
    out = cpu_backend(calls).attention(query.half(), cache, md, spec)
    assert (calls.varlen, calls.kvcache) == (1, 0) and out.dtype == torch.float16
    torch.testing.assert_close(out, reference(query.half(), cache, md, spec), **BF16_TOL)


def test_decode_step_uses_the_kv_cache_call_and_keeps_padding_tokens() -> None:
    """A decode-only step goes through flash_attn_with_kvcache; padding tokens after the rows keep the output shape."""
    spec = AttentionSpec(8, 1, 128)
    md, cache, query = make_step([(1, 300), (1, 1), (1, 512)], spec, block_size=512)
    padded = dataclasses.replace(md, slot_mapping=torch.cat([md.slot_mapping, torch.full((2,), -1)]))
    query = torch.cat([query, torch.zeros(2, 8, 128)]).bfloat16()
    calls = Calls()
    out = cpu_backend(calls).attention(query, cache, padded, spec)
    assert (calls.varlen, calls.kvcache) == (0, 1) and out.shape == query.shape
    torch.testing.assert_close(out[:3], reference(query[:3], cache, md, spec), **BF16_TOL)


def test_graph_padded_decode_step() -> None:
    """A padded uniform-decode batch (as replayed in a graph): the live rows are exact."""
    spec = AttentionSpec(4, 2, 64, sliding_window=100)
    live, cache, query = make_step([(1, 270), (1, 5)], spec, seed=3)
    static, _, _ = make_step([(1, 270), (1, 5)], spec, pad_to=5, seed=3)
    padded_query = torch.cat([query, torch.zeros(3, 4, 64)]).bfloat16()
    out = cpu_backend(Calls()).attention(padded_query, cache, static, spec)
    torch.testing.assert_close(out[:2], reference(padded_query[:2], cache, live, spec), **BF16_TOL)


def test_too_old_flash_attn_is_refused() -> None:
    """Before 2.6 the varlen call has no block table or soft cap."""
    with pytest.raises(PagedError, match=r"needs flash-attn >= 2.6 .* found 2.5.9"):
        cpu_backend(Calls(), version="2.5.9")
