"""FlashInferBackend on a CPU: availability, the declared envelope, and its plumbing driven through a stand-in.

The stand-in ``flashinfer`` module keeps the wrappers' documented contract (CUDA-graph decode wrappers copy the
step's arrays into the buffers given at construction and refuse another batch size; ``run`` refuses a query
dtype other than the planned one) and computes with the model of FlashInfer's kernels, so ``prepare`` and
``attention`` run end to end, graph-runner flow included, without a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from paged_backend_cuda import environment, flashinfer_backend
from paged_backend_cuda.flashinfer_backend import INSTALL_HINT, FlashInferBackend
from paged_backend_cuda.flashinfer_model import batch_decode_with_paged_kv_cache, batch_prefill_with_paged_kv_cache
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
def no_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``flashinfer`` unfindable, whatever is installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))


@cpu_only
def test_unavailable_here_with_a_reason() -> None:
    """On this CPU-only machine: unavailable, with a reason, on the CPU."""
    avail = FlashInferBackend.availability()
    assert not avail.available and avail.reason and avail.device == "cpu"


def test_missing_flashinfer_is_the_reason_on_a_gpu_machine(
    monkeypatch: pytest.MonkeyPatch, no_flashinfer: None
) -> None:
    """With a usable GPU but no flashinfer, the reason is the install hint."""
    monkeypatch.setattr(environment, "refusal", lambda: None)
    avail = FlashInferBackend.availability()
    assert not avail.available and avail.reason == INSTALL_HINT


def test_construction_without_flashinfer_is_refused(no_flashinfer: None) -> None:
    """Constructing it raises PagedError naming the extra to install."""
    with pytest.raises(
        PagedError, match=r"flashinfer is not installed: pip install 'paged-backend-cuda\[flashinfer\]'"
    ):
        FlashInferBackend()


@cpu_only
def test_construction_is_refused_here() -> None:
    """Whatever is installed, a CPU-only machine cannot construct it."""
    with pytest.raises(PagedError):
        FlashInferBackend()


def test_declared_envelope() -> None:
    """bf16/fp16, heads 64/128/256, blocks 16/32/64, any GQA, window, soft cap, uniform-decode graphs."""
    caps = FlashInferBackend.capabilities()
    backend = FlashInferBackend
    assert (backend.name, backend.priority, backend.api_version) == ("cuda-flashinfer", 70, 1)
    assert caps.dtypes == caps.effective_kv_cache_dtypes == {torch.bfloat16, torch.float16}
    assert caps.block_sizes == (16, 32, 64) and caps.head_sizes == {64, 128, 256} and caps.gqa_ratios is None
    assert caps.sliding_window and caps.logits_soft_cap and caps.graph_support == GraphSupport.UNIFORM_DECODE
    caps.check(AttentionSpec(32, 4, 128, sliding_window=8, logits_soft_cap=30.0), torch.bfloat16, 16, torch.float16)


def test_envelope_refusals_name_the_supported_values() -> None:
    """fp32 and head size 96 are refused, each naming what is supported."""
    caps = FlashInferBackend.capabilities()
    with pytest.raises(
        UnsupportedConfigError, match=r"dtype torch.float32 not supported \(supported: bfloat16, float16\)"
    ):
        caps.check(AttentionSpec(8, 8, 128), torch.float32, 16)
    with pytest.raises(UnsupportedConfigError, match=r"head_size 96 not supported \(supported: \[64, 128, 256\]\)"):
        caps.check(AttentionSpec(8, 8, 96), torch.bfloat16, 16)
    with pytest.raises(UnsupportedConfigError, match=r"block_size 256 not supported \(supported: \[16, 32, 64\]\)"):
        caps.check(AttentionSpec(8, 8, 128), torch.bfloat16, 256)


class FakeDecodeWrapper:
    """``BatchDecodeWithPagedKVCacheWrapper`` in CUDA-graph mode, as documented, computing with the model."""

    def __init__(
        self,
        workspace: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
    ) -> None:
        assert kv_layout == "NHD" and use_cuda_graph and workspace.dtype == torch.uint8
        assert paged_kv_indptr_buffer is not None and paged_kv_indices_buffer is not None
        assert paged_kv_last_page_len_buffer is not None
        self.indptr, self.indices = paged_kv_indptr_buffer, paged_kv_indices_buffer
        self.last = paged_kv_last_page_len_buffer
        self.use_tensor_cores = use_tensor_cores
        self.plans = 0

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: torch.dtype = torch.float16,
        kv_data_type: torch.dtype | None = None,
        sm_scale: float | None = None,
    ) -> None:
        if len(last_page_len) != len(self.last) or len(indices) > len(self.indices):
            raise ValueError("The batch size should be fixed in cudagraph mode")
        self.indptr.copy_(indptr)
        self.last.copy_(last_page_len)
        self.indices[: len(indices)].copy_(indices)
        self.options = {"window_left": window_left, "logits_soft_cap": logits_soft_cap, "sm_scale": sm_scale}
        self.dtypes = (q_data_type, kv_data_type)
        self.plans += 1

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor], *, out: torch.Tensor) -> None:
        assert (q.dtype, paged_kv_cache[0].dtype) == self.dtypes, "q/kv dtype differs from the planned one"
        pair = (paged_kv_cache[0].float(), paged_kv_cache[1].float())
        out.copy_(
            batch_decode_with_paged_kv_cache(q.float(), pair, self.indptr, self.indices, self.last, **self.options)
        )


class FakePrefillWrapper:
    """``BatchPrefillWithPagedKVCacheWrapper`` (not in graph mode), computing with the model."""

    def __init__(self, workspace: torch.Tensor, kv_layout: str = "NHD") -> None:
        assert kv_layout == "NHD"
        self.plans = 0

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        *,
        causal: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: torch.dtype = torch.float16,
        kv_data_type: torch.dtype | None = None,
        sm_scale: float | None = None,
    ) -> None:
        # Host arrays are copied to the device by plan; the page ids (already on the device) are kept by reference.
        self.arrays = (qo_indptr.clone(), paged_kv_indptr.clone(), paged_kv_indices, paged_kv_last_page_len.clone())
        self.options = {"causal": causal, "window_left": window_left, "logits_soft_cap": logits_soft_cap}
        self.options["sm_scale"] = sm_scale
        self.dtypes = (q_data_type, kv_data_type)
        self.plans += 1

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor], *, out: torch.Tensor) -> None:
        assert (q.dtype, paged_kv_cache[0].dtype) == self.dtypes and q.shape[0] == int(self.arrays[0][-1])
        pair = (paged_kv_cache[0].float(), paged_kv_cache[1].float())
        out.copy_(batch_prefill_with_paged_kv_cache(q.float(), pair, *self.arrays, **self.options))


def cpu_backend() -> FlashInferBackend:
    """The backend bound to the stand-in module on the CPU (its constructor insists on a GPU)."""
    backend = FlashInferBackend.__new__(FlashInferBackend)
    backend.device = torch.device("cpu")
    fake = SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=FakeDecodeWrapper, BatchPrefillWithPagedKVCacheWrapper=FakePrefillWrapper
    )
    backend._start(fake)
    return backend


NUM_BLOCKS = 40


def make_cache(spec: AttentionSpec, block_size: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, NUM_BLOCKS, block_size, spec.num_kv_heads, spec.head_size)
    return torch.randn(shape, generator=gen).to(torch.bfloat16)


def make_metadata(
    rows: list[tuple[int, int]], block_size: int, seed: int, pad_to: int = 0, width: int = 6
) -> AttentionMetadata:
    """Rows ``(query_len, seq_len)`` in random blocks; ``pad_to`` adds graph padding rows (host copies: live rows)."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-seq // block_size) for _, seq in rows]
    free = (torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1).tolist()
    tables = [free[sum(needed[:b]) : sum(needed[: b + 1])] for b in range(len(rows))]
    pad = max(pad_to - len(rows), 0)
    md = build_attention_metadata(
        [q for q, _ in rows] + [1] * pad,
        [s for _, s in rows] + [1] * pad,
        tables + [[0]] * pad,
        block_size,
        max_blocks_per_seq=width,
    )
    if not pad:
        return md
    assert md.query_start_loc_cpu is not None and md.seq_lens_cpu is not None
    live = len(rows)
    return dataclasses.replace(
        md, query_start_loc_cpu=md.query_start_loc_cpu[: live + 1], seq_lens_cpu=md.seq_lens_cpu[:live]
    )


def reference(query: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata, spec: AttentionSpec) -> torch.Tensor:
    return ReferenceBackend().attention(query.to(cache.dtype), cache, md, spec).to(query.dtype)


def test_mixed_step_matches_reference_and_casts_the_query() -> None:
    """Decode then prefill rows into one output; an fp16 query over a bf16 cache comes back fp16."""
    spec = AttentionSpec(8, 2, 64, sliding_window=20, logits_soft_cap=8.0)
    cache = make_cache(spec, 16)
    md = make_metadata([(1, 40), (1, 7), (9, 30), (4, 4)], 16, seed=1)
    query = torch.randn(md.num_tokens, 8, 64, generator=torch.Generator().manual_seed(2)).half()
    backend = cpu_backend()
    backend.prepare(md)
    out = backend.attention(query, cache, md, spec)
    assert out.dtype == torch.float16 and out.shape == query.shape
    torch.testing.assert_close(out, reference(query, cache, md, spec), **BF16_TOL)


def test_decode_wrappers_are_kept_per_row_count_and_reused() -> None:
    """One CUDA-graph decode wrapper per (decode rows, table width), the same object and buffers step after step."""
    spec = AttentionSpec(8, 1, 64)  # GQA 8: tensor-core decode
    cache = make_cache(spec, 16)
    backend = cpu_backend()
    seen = []
    for seed, rows in enumerate([[(1, 20), (1, 5)], [(1, 3), (1, 33), (1, 60)], [(1, 70), (1, 1)]]):
        md = make_metadata(rows, 16, seed)
        query = torch.randn(md.num_tokens, 8, 64).bfloat16()
        backend.prepare(md)
        out = backend.attention(query, cache, md, spec)
        torch.testing.assert_close(out, reference(query, cache, md, spec), **BF16_TOL)
        (wrappers,) = backend._wrappers.values()
        seen.append(wrappers.decode[(len(rows), 6)])
    assert set(wrappers.decode) == {(2, 6), (3, 6)}
    assert seen[0] is seen[2] and seen[0].plans == 2 and seen[0].use_tensor_cores


def test_every_known_configuration_is_replanned_in_prepare() -> None:
    """Configurations are learned at their first eager call; later steps plan them all in prepare."""
    local, full = AttentionSpec(4, 4, 64, sliding_window=8), AttentionSpec(4, 4, 64)
    cache = make_cache(local, 16)
    backend = cpu_backend()
    for seed in range(2):
        md = make_metadata([(1, 30), (6, 12)], 16, seed)
        backend.prepare(md)
        query = torch.randn(md.num_tokens, 4, 64).bfloat16()
        for layer in (local, full):
            out = backend.attention(query, cache, md, layer)
            torch.testing.assert_close(out, reference(query, cache, md, layer), **BF16_TOL)
    assert len(backend._wrappers) == 2
    assert all(w.prefill.plans == 2 and w.decode[(1, 6)].plans == 2 for w in backend._wrappers.values())


def test_capture_refuses_what_it_cannot_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """While capturing: an unprepared step and a configuration never seen eagerly are refused with a reason."""
    spec = AttentionSpec(4, 4, 64)
    cache = make_cache(spec, 16)
    md = make_metadata([(1, 30), (1, 12)], 16, seed=0)
    query = torch.randn(md.num_tokens, 4, 64).bfloat16()
    backend = cpu_backend()
    monkeypatch.setattr(flashinfer_backend, "_capturing", lambda device: True)
    with pytest.raises(PagedError, match=r"prepare\(metadata\) must run before a step is captured"):
        backend.attention(query, cache, md, spec)
    backend.prepare(md)
    with pytest.raises(PagedError, match="first seen during CUDA graph capture"):
        backend.attention(query, cache, md, spec)


def test_graph_runner_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the graph runner drives it: prepare the static batch, warm up, capture, then replay padded live batches.

    The step always sees a new metadata object over the static tensors; replays prepare with live host
    copies shorter than the padded size, and nothing may be planned during capture or replay.
    """
    spec = AttentionSpec(4, 2, 64, logits_soft_cap=20.0)
    cache = make_cache(spec, 16)
    n = 4
    static = make_metadata([(1, 1)] * n, 16, seed=0)  # what fill_padding leaves: n one-token rows in block 0
    static = dataclasses.replace(static, query_start_loc_cpu=None, seq_lens_cpu=None)
    backend = cpu_backend()
    backend.prepare(static)
    query = torch.zeros(n, 4, 64, dtype=torch.bfloat16)
    backend.attention(query, cache, dataclasses.replace(static), spec)  # warm-up: learns the configuration
    monkeypatch.setattr(flashinfer_backend, "_capturing", lambda device: True)
    backend.attention(query, cache, dataclasses.replace(static), spec)  # "capture": planned, so allowed
    for seed, rows in enumerate([[(1, 40), (1, 3)], [(1, 17), (1, 64), (1, 2)]]):
        live = make_metadata(rows, 16, seed, pad_to=n)
        for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
            getattr(static, name).copy_(getattr(live, name))  # the runner fills its static buffers
        backend.prepare(
            dataclasses.replace(static, query_start_loc_cpu=live.query_start_loc_cpu, seq_lens_cpu=live.seq_lens_cpu)
        )
        query = torch.randn(n, 4, 64).bfloat16()
        out = backend.attention(query, cache, dataclasses.replace(static), spec)  # "replay"
        unpadded = make_metadata(rows, 16, seed)
        k = len(rows)
        torch.testing.assert_close(out[:k], reference(query[:k], cache, unpadded, spec), **BF16_TOL)
    (wrappers,) = backend._wrappers.values()
    assert set(wrappers.decode) == {(n, 6)} and wrappers.prefill is None


def test_metadata_not_prepared_is_planned_on_the_spot_when_eager() -> None:
    """A caller that skips prepare still gets the right answer eagerly."""
    spec = AttentionSpec(4, 4, 64)
    cache = make_cache(spec, 32)
    backend = cpu_backend()
    for seed, rows in enumerate([[(1, 30), (5, 9)], [(3, 3)]]):
        md = make_metadata(rows, 32, seed)
        query = torch.randn(md.num_tokens, 4, 64).bfloat16()
        torch.testing.assert_close(
            backend.attention(query, cache, md, spec), reference(query, cache, md, spec), **BF16_TOL
        )


def test_stand_in_matches_the_documented_keywords() -> None:
    """The keywords the backend passes are the stand-in's, which are those of FlashInfer 0.5.3 and 0.6.18."""
    spec = AttentionSpec(4, 4, 64)
    backend = cpu_backend()
    md = make_metadata([(1, 30), (5, 9)], 16, seed=0)
    backend.prepare(md)
    backend.attention(torch.zeros(md.num_tokens, 4, 64, dtype=torch.bfloat16), make_cache(spec, 16), md, spec)
    (wrappers,) = backend._wrappers.values()
    decode: Any = wrappers.decode[(1, 6)]
    assert decode.options == {"window_left": -1, "logits_soft_cap": None, "sm_scale": 64**-0.5}
    assert wrappers.prefill.options["causal"] is True
