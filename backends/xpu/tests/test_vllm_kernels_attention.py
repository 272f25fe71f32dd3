"""VllmXpuKernelsBackend's real code on CPU tensors, against a stand-in library, vs the reference backend.

The stand-in has the signatures of vllm-xpu-kernels 0.1.16.2's ``flash_attn_varlen_func`` (the Python wrapper in
``vllm_xpu_kernels/flash_attn_interface.py``) and ``torch.ops._C_cache_ops.reshape_and_cache_flash``
(``csrc/torch_bindings.cpp``), enforces the checks the backend must satisfy (the wrapper's asserts,
``flash_api.cpp``'s dtype/stride/int32 checks, blocks of 16n, ``"auto"`` storing the key's own dtype, int64
slots) and computes what the kernels compute, in pure torch: paged keys through the block table, key lengths
from ``seqused_k``, bottom-right causal mask, window ``(left, right)`` with ``-1`` unbounded, and **no** soft cap
(``mha_varlen_fwd`` drops it). It also reproduces the wrapper's speculative-decode shortcut, which decides from
shapes alone that every row has ``max_seqlen_q`` tokens. The backend reaches it through the module's one seam,
``_bind``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from paged_backend_xpu import vllm_kernels_backend
from paged_backend_xpu.vllm_kernels_backend import VllmXpuKernels, VllmXpuKernelsBackend
from paged_backend_xpu.vllm_kernels_plan import plan_vllm_kernels
from paged_core.api import AttentionMetadata, AttentionSpec, UnsupportedConfigError, build_attention_metadata
from paged_core.testing import ReferenceBackend

TOL: dict[torch.dtype, float] = {torch.bfloat16: 2e-2, torch.float16: 2e-3}
"""Absolute and relative tolerance per dtype."""
SPEC_DECODE_MAX_QLEN = 16
"""The wrapper's default ``VLLM_XPU_SPEC_DECODE_MAX_QLEN``."""


class HostReadGuard(TorchFunctionMode):
    """Fails on any read of a tensor's values on the host while the backend's own code runs."""

    FORBIDDEN = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"})

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.paused and getattr(func, "__name__", "") in self.FORBIDDEN:
            raise AssertionError(f"host read of a tensor: {func.__name__}")
        return func(*args, **(kwargs or {}))


class StandIn:
    """The library's two calls, in pure torch; records every call's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.guard: HostReadGuard | None = None

    def kernels(self) -> VllmXpuKernels:
        return VllmXpuKernels(
            flash_attn_varlen_func=self._paused(self.flash_attn_varlen_func),
            reshape_and_cache_flash=self._paused(self.reshape_and_cache_flash),
            version="0.1.16.2",
        )

    def _paused(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.guard is None:
                return fn(*args, **kwargs)
            self.guard.paused = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.guard.paused = False

        return call

    def reshape_and_cache_flash(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
    ) -> None:
        self.calls.append({"op": "reshape_and_cache_flash", "num_tokens": slot_mapping.shape[0]})
        assert kv_cache_dtype == "auto"
        assert key.dtype == value.dtype == key_cache.dtype == value_cache.dtype, "auto stores the key's dtype"
        assert slot_mapping.dtype == torch.int64
        assert isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor)
        heads, head_size = key.shape[1], key.shape[2]
        for x in (key, value):  # one token's heads are walked as one dense run from row stride(0)
            assert x.stride(2) == 1 and (heads == 1 or x.stride(1) == head_size)
        assert key_cache.stride(0) == value_cache.stride(0) and key_cache.stride(2) == head_size
        block_size = key_cache.shape[1]
        for t, slot in enumerate(slot_mapping.tolist()):
            if slot < 0:
                continue  # cache.cpp: if (slot_idx < 0) return;
            key_cache[slot // block_size, slot % block_size] = key[t]
            value_cache[slot // block_size, slot % block_size] = value[t]

    def flash_attn_varlen_func(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        max_seqlen_q: int,
        cu_seqlens_q: torch.Tensor,
        max_seqlen_k: int,
        cu_seqlens_k: torch.Tensor | None = None,
        seqused_k: torch.Tensor | None = None,
        q_v: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: list[int] | None = None,
        softcap: float = 0.0,
        alibi_slopes: torch.Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
        block_table: torch.Tensor | None = None,
        return_softmax_lse: bool = False,
        out: torch.Tensor | None = None,
        scheduler_metadata: Any = None,
        q_descale: torch.Tensor | None = None,
        k_descale: torch.Tensor | None = None,
        v_descale: torch.Tensor | None = None,
        num_splits: int = 0,
        fa_version: int = 2,
        s_aux: torch.Tensor | None = None,
        num_splits_kv: int | None = None,
        is_mix_batch: bool = True,
        host_kv_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.calls.append(
            {
                "op": "varlen",
                "q_rows": q.shape[0],
                "max_seqlen_q": max_seqlen_q,
                "causal": causal,
                "window_size": window_size,
                "softcap": softcap,
            }
        )
        # The wrapper's asserts.
        assert cu_seqlens_k is not None or seqused_k is not None, "cu_seqlens_k or seqused_k must be provided"
        assert cu_seqlens_k is None or seqused_k is None, "cu_seqlens_k and seqused_k cannot be provided together"
        assert block_table is None or seqused_k is not None, "when enable block_table, seqused_k is needed"
        assert block_table is not None and seqused_k is not None, "the stand-in models the paged path only"
        # flash_api.cpp mha_varlen_fwd and the chunk-prefill / decode dispatch.
        assert q.dtype in (torch.float16, torch.bfloat16), "VLLM Kernel XPU only supports fp16 and bf16 type"
        assert k.dtype == v.dtype == q.dtype, "query, key and value must have the same dtype"
        assert q.dim() == 3 and all(x.stride(-1) == 1 for x in (q, k, v))
        assert block_table.dtype == torch.int32 and block_table.stride(-1) == 1
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_q.is_contiguous()
        assert seqused_k.dtype == torch.int32
        block_size, kv_heads, head_size = k.shape[1], k.shape[2], k.shape[3]
        assert block_size % 16 == 0 and head_size <= 512
        if out is None:
            out = torch.empty_like(q)
        assert out.shape == q.shape and out.dtype == q.dtype
        scale = softmax_scale if softmax_scale is not None else head_size**-0.5
        left, right = window_size if window_size is not None else (-1, -1)
        batch = cu_seqlens_q.numel() - 1
        if (
            causal
            and softcap == 0.0
            and 1 < max_seqlen_q <= SPEC_DECODE_MAX_QLEN
            and q.shape[0] == batch * max_seqlen_q
        ):
            # _spec_decode_varlen_fwd: uniform query length taken from the shapes, cu_seqlens_q unused.
            starts = [b * max_seqlen_q for b in range(batch + 1)]
        else:
            starts = cu_seqlens_q.tolist()
        group = q.shape[1] // kv_heads
        for b in range(batch):
            start, end = starts[b], starts[b + 1]
            q_len, kv_len = end - start, int(seqused_k[b])
            if q_len <= 0:
                continue
            blocks = block_table[b, : -(-kv_len // block_size)].long()
            keys = k[blocks].reshape(-1, kv_heads, head_size)[:kv_len].float().repeat_interleave(group, 1)
            values = v[blocks].reshape(-1, kv_heads, head_size)[:kv_len].float().repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), keys) * scale  # softcap: dropped
            pos = torch.arange(kv_len - q_len, kv_len).view(-1, 1)
            col = torch.arange(kv_len).view(1, -1)
            visible = torch.ones(q_len, kv_len, dtype=torch.bool)
            if causal or q_len == 1:
                visible &= col <= pos
            if left != -1 or right != -1:
                if left != -1:
                    visible &= col >= pos - left
                if right != -1:
                    visible &= col <= pos + right
            probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
            out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(out.dtype)
        return out


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> StandIn:
    """Route the backend's ``_bind`` seam to a fresh stand-in (any device accepted, so CPU tensors work)."""
    lib = StandIn()
    monkeypatch.setattr(vllm_kernels_backend, "_bind", lambda device: lib.kernels())
    return lib


def spec(heads: int = 4, kv_heads: int = 4, head_size: int = 64, **kwargs: Any) -> AttentionSpec:
    return AttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, **kwargs)


@dataclasses.dataclass(frozen=True)
class Step:
    """A step whose cache holds every row's earlier tokens (random), in shuffled blocks; this step's KV is new."""

    spec: AttentionSpec
    metadata: AttentionMetadata
    cache: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor


def make_step(
    rows: list[tuple[int, int]], block_size: int, sp: AttentionSpec, dtype: torch.dtype, pad: int = 0, seed: int = 0
) -> Step:
    """``rows`` are ``(query_len, seq_len)``, decodes first; ``pad`` eager padding tokens (slot -1) follow."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-seq // block_size) for _, seq in rows]
    num_blocks = sum(needed) + 3
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 stays the null block
    tables = [free[sum(needed[:b]) : sum(needed[: b + 1])] for b in range(len(rows))]
    metadata = build_attention_metadata(
        [q for q, _ in rows], [s for _, s in rows], tables, block_size, max_blocks_per_seq=max(needed) + 1
    )
    if pad:
        slots = torch.cat([metadata.slot_mapping, torch.full((pad,), -1, dtype=torch.int64)])
        metadata = dataclasses.replace(metadata, slot_mapping=slots)
    tokens = metadata.num_tokens
    cache = torch.randn(2, num_blocks, block_size, sp.num_kv_heads, sp.head_size, generator=gen).to(dtype)
    query = 2 * torch.randn(tokens, sp.num_heads, sp.head_size, generator=gen).to(dtype)
    key = torch.randn(tokens, sp.num_kv_heads, sp.head_size, generator=gen).to(dtype)
    value = torch.randn(tokens, sp.num_kv_heads, sp.head_size, generator=gen).to(dtype)
    return Step(sp, metadata, cache, query, key, value)


def run_backend(step: Step, guard: bool = True, lib: StandIn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's forward (write, then attend) on a copy of the cache; no host reads outside the stand-in."""
    backend = VllmXpuKernelsBackend("cpu")
    cache = step.cache.clone()
    mode = HostReadGuard()
    if lib is not None and guard:
        lib.guard = mode
        with mode:
            out = backend.forward(step.query, step.key, step.value, cache, step.metadata, step.spec)
        lib.guard = None
    else:
        out = backend.forward(step.query, step.key, step.value, cache, step.metadata, step.spec)
    return out, cache


def run_reference(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    cache = step.cache.clone()
    out = ReferenceBackend().forward(step.query, step.key, step.value, cache, step.metadata, step.spec)
    return out, cache


def assert_matches(step: Step, out: torch.Tensor, cache: torch.Tensor) -> None:
    ref_out, ref_cache = run_reference(step)
    real = step.metadata.num_actual_tokens
    assert out.shape == step.query.shape and out.dtype == step.query.dtype
    tol = TOL[step.query.dtype]
    torch.testing.assert_close(out[:real], ref_out[:real], atol=tol, rtol=tol)
    assert torch.equal(cache, ref_cache)


CASES: dict[str, tuple[list[tuple[int, int]], int, AttentionSpec]] = {
    "decode-only": ([(1, 5), (1, 64), (1, 65), (1, 300)], 64, spec(8, 2)),
    "prefill-only": ([(40, 40), (7, 7)], 64, spec()),
    "mixed-prefix-gqa8": ([(1, 129), (1, 1), (30, 200), (12, 140)], 64, spec(8, 1)),
    "smollm2-gqa3": ([(1, 70), (1, 3), (17, 17), (9, 90)], 64, spec(9, 3)),
    "block-edges-64": ([(1, 64), (1, 65), (3, 128), (2, 129), (64, 64)], 64, spec(2, 2, 128)),
    "block-edges-128": ([(1, 128), (1, 129), (5, 256), (6, 257)], 128, spec(4, 2, 128)),
    "block-edges-256": ([(1, 256), (1, 257), (20, 300)], 256, spec(4, 1)),
    "window-decode": ([(1, 300), (1, 20), (1, 49), (1, 50), (1, 51)], 64, spec(4, 2, sliding_window=50)),
    "window-mixed": ([(1, 300), (64, 270), (5, 5)], 64, spec(4, 1, 128, sliding_window=33)),
    "window-1": ([(1, 9), (4, 9)], 64, spec(2, 1, sliding_window=1)),
    "window-at-block": ([(1, 200), (70, 190)], 128, spec(8, 8, sliding_window=64)),
    "uniform-spec-decode": ([(3, 70), (3, 3), (3, 130)], 64, spec(4, 2)),
    "explicit-scale": ([(1, 100), (10, 80)], 64, spec(8, 4, scale=0.3)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", CASES)
def test_forward_matches_reference(standin: StandIn, name: str, dtype: torch.dtype) -> None:
    """Write + attention through the stand-in equal the reference backend's, with no host reads by the backend."""
    rows, block, sp = CASES[name]
    step = make_step(rows, block, sp, dtype)
    VllmXpuKernelsBackend.capabilities().check(sp, dtype, block)
    out, cache = run_backend(step, lib=standin)
    assert_matches(step, out, cache)
    varlen = [c for c in standin.calls if c["op"] == "varlen"]
    assert len(varlen) == 1 and varlen[0]["causal"]  # decode and prefill rows in one call


def test_eager_padding_is_cut_before_the_library(standin: StandIn) -> None:
    """Padding tokens (slot -1) are not written, and the query is cut to num_actual_tokens.

    Rows of 1 and 3 tokens padded to 6 look uniform (2 rows x 3) to the wrapper's shape test: without the cut
    the speculative-decode shortcut would treat row 0 as three tokens.
    """
    step = make_step([(1, 40), (3, 50)], 64, spec(4, 2), torch.bfloat16, pad=2)
    assert step.metadata.num_tokens == 6 and step.metadata.num_actual_tokens == 4
    out, cache = run_backend(step, lib=standin)
    assert_matches(step, out, cache)
    assert [c["q_rows"] for c in standin.calls if c["op"] == "varlen"] == [4]


def test_uncut_padding_would_be_wrong(standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: hand the library every row of the padded query and the result is wrong (the stand-in can fail)."""
    step = make_step([(1, 40), (3, 50)], 64, spec(4, 2), torch.bfloat16, pad=2)

    def uncut(metadata: AttentionMetadata, sp: AttentionSpec) -> Any:
        return dataclasses.replace(plan_vllm_kernels(metadata, sp), num_tokens=metadata.num_tokens)

    monkeypatch.setattr(vllm_kernels_backend, "plan_vllm_kernels", uncut)
    out, _ = run_backend(step, lib=standin)
    ref, _ = run_reference(step)
    assert not torch.allclose(out[:4].float(), ref[:4].float(), atol=0.1)


def test_uniform_decode_graph_shaped_step(standin: StandIn) -> None:
    """A captured pure-decode step: padding rows (q 1, seq_len 1, null block, slot -1) fill it to n tokens.

    ``num_actual_tokens`` is n, nothing is cut, the write launches over all n slots and skips the -1s, and the
    real rows match the reference.
    """
    sp = spec(8, 2)
    real = make_step([(1, 70), (1, 5), (1, 128)], 64, sp, torch.bfloat16)
    m = real.metadata
    n, width = 5, m.block_table.shape[1]
    metadata = dataclasses.replace(
        m,
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens=torch.cat([m.seq_lens, torch.ones(n - 3, dtype=torch.int32)]),
        block_table=torch.cat([m.block_table, torch.zeros(n - 3, width, dtype=torch.int32)]),
        slot_mapping=torch.cat([m.slot_mapping, torch.full((n - 3,), -1, dtype=torch.int64)]),
        num_decodes=n,
        num_decode_tokens=n,
        num_actual_tokens=n,
        max_seq_len=4096,
        query_start_loc_cpu=None,
        seq_lens_cpu=None,
        uniform_query_len=1,
    )
    pad = torch.zeros(n - 3, *real.query.shape[1:], dtype=real.query.dtype)
    padk = torch.zeros(n - 3, *real.key.shape[1:], dtype=real.key.dtype)
    step = dataclasses.replace(
        real,
        metadata=metadata,
        query=torch.cat([real.query, pad]),
        key=torch.cat([real.key, padk]),
        value=torch.cat([real.value, padk]),
    )
    out, cache = run_backend(step, lib=standin)
    ref_out, ref_cache = run_reference(real)
    torch.testing.assert_close(out[:3], ref_out, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])
    assert torch.equal(cache, ref_cache)  # the padding slots wrote nothing
    calls = {c["op"]: c for c in standin.calls}
    assert calls["varlen"]["q_rows"] == n and calls["varlen"]["max_seqlen_q"] == 1
    assert calls["reshape_and_cache_flash"]["num_tokens"] == n


def test_write_casts_and_accepts_fused_qkv_views(standin: StandIn) -> None:
    """fp32 keys/values are cast to the bf16 cache; strided views of a fused QKV projection are accepted.

    (The query is bf16: fp32 queries are outside the declared dtypes and refused, see the next test.)"""
    sp = spec(4, 2)
    step = make_step([(1, 30), (6, 6)], 64, sp, torch.bfloat16)
    tokens = step.metadata.num_tokens
    fused = torch.randn(tokens, (sp.num_heads + 2 * sp.num_kv_heads) * sp.head_size)
    q_width, kv_width = sp.num_heads * sp.head_size, sp.num_kv_heads * sp.head_size
    q, k, v = fused[:, :q_width], fused[:, q_width : q_width + kv_width], fused[:, q_width + kv_width :]
    step = dataclasses.replace(
        step,
        query=q.reshape(tokens, sp.num_heads, sp.head_size).to(torch.bfloat16),
        key=k.view(tokens, sp.num_kv_heads, sp.head_size),
        value=v.view(tokens, sp.num_kv_heads, sp.head_size),
    )
    assert not step.key.is_contiguous()
    out, cache = run_backend(step, lib=standin)
    assert out.dtype == torch.bfloat16
    ref_cache = step.cache.clone()
    ReferenceBackend().write_kv(step.key, step.value, ref_cache, step.metadata)
    assert torch.equal(cache, ref_cache)


def test_undeclared_query_dtype_is_refused(standin: StandIn) -> None:
    """fp32 queries are outside the envelope (the library runs bf16/fp16): refused naming the supported set."""
    step = make_step([(1, 30)], 64, spec(4, 2), torch.bfloat16)
    backend = VllmXpuKernelsBackend("cpu")
    with pytest.raises(UnsupportedConfigError, match=r"dtype torch.float32 not supported \(supported: bfloat16"):
        backend.attention(step.query.float(), step.cache, step.metadata, step.spec)


def test_soft_cap_is_refused_not_dropped(standin: StandIn) -> None:
    """The library would silently ignore softcap: the backend refuses the spec instead of calling it."""
    step = make_step([(1, 30)], 64, spec(4, 2, logits_soft_cap=30.0), torch.bfloat16)
    backend = VllmXpuKernelsBackend("cpu")
    with pytest.raises(UnsupportedConfigError, match="soft cap"):
        backend.attention(step.query, step.cache, step.metadata, step.spec)
    assert not [c for c in standin.calls if c["op"] == "varlen"]


def test_copy_blocks_matches_reference(standin: StandIn) -> None:
    """Whole blocks, keys and values, in every layer."""
    gen = torch.Generator().manual_seed(3)
    caches = [torch.randn(2, 8, 64, 2, 64, generator=gen).to(torch.bfloat16) for _ in range(2)]
    expected = [c.clone() for c in caches]
    pairs = torch.tensor([[1, 4], [2, 5], [7, 0]])
    VllmXpuKernelsBackend("cpu").copy_blocks(caches, pairs)
    ReferenceBackend().copy_blocks(expected, pairs)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected, strict=True))


def mutate(standin: StandIn, change: Callable[[dict[str, Any]], None]) -> None:
    """Make the stand-in apply ``change`` to the keyword arguments it receives, before computing."""
    inner = standin.flash_attn_varlen_func

    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        change(kwargs)
        return inner(*args, **kwargs)

    standin.flash_attn_varlen_func = wrapper  # type: ignore[method-assign]


def _shift_window(delta: int) -> Callable[[dict[str, Any]], None]:
    def change(kwargs: dict[str, Any]) -> None:
        left, right = kwargs["window_size"]
        kwargs["window_size"] = [left + delta, right]

    return change


def _shift_cu_seqlens_q(kwargs: dict[str, Any]) -> None:
    cu = kwargs["cu_seqlens_q"].clone()
    cu[1:-1] += 1
    kwargs["cu_seqlens_q"] = cu


def _shorten_seqused_k(kwargs: dict[str, Any]) -> None:
    kwargs["seqused_k"] = kwargs["seqused_k"] - 1


def _not_causal(kwargs: dict[str, Any]) -> None:
    kwargs["causal"] = False


MUTATIONS: dict[str, tuple[Callable[[dict[str, Any]], None], list[tuple[int, int]], AttentionSpec]] = {
    "window-left-is-W": (_shift_window(+1), [(1, 300), (40, 120)], spec(4, 2, sliding_window=50)),
    "window-left-is-W-2": (_shift_window(-1), [(1, 300), (40, 120)], spec(4, 2, sliding_window=50)),
    "cu_seqlens_q-off-by-one": (_shift_cu_seqlens_q, [(1, 90), (20, 70), (9, 40)], spec(4, 2)),
    "seqused_k-off-by-one": (_shorten_seqused_k, [(1, 90), (20, 70)], spec(4, 2)),
    "not-causal": (_not_causal, [(1, 90), (20, 70)], spec(4, 2)),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutations_are_caught(standin: StandIn, name: str) -> None:
    """Each off-by-one in what reaches the library changes the result: the comparison above can fail."""
    change, rows, sp = MUTATIONS[name]
    step = make_step(rows, 64, sp, torch.float16)
    mutate(standin, change)
    out, _ = run_backend(step, guard=False)
    ref, _ = run_reference(step)
    assert not torch.allclose(out.float(), ref.float(), atol=TOL[torch.float16], rtol=TOL[torch.float16])


def test_host_read_guard_catches_reads() -> None:
    """The guard the forward tests run under does fail on host reads (so their silence means something)."""
    t = torch.tensor([3])
    for read in (t.item, t.tolist, lambda: bool(t), lambda: int(t[0]), t.cpu):
        with pytest.raises(AssertionError, match="host read"), HostReadGuard():
            read()
