"""The CUDA kernels run on the CPU: the real ``csrc`` sources compiled by a host C++ compiler against
``csrc/emulation/cuda_on_cpu.h`` (each block's threads as fibers, blocks one after another), to test them
without a GPU.

:func:`write_kv`, :func:`copy_blocks` and :func:`attention` are :mod:`paged_backend_cuda.kernels`' calls on
CPU tensors: the same conversions, launch plan and buffers (:func:`kernels.run_attention`), with the launchers of
``csrc/launch.h`` called through ``ctypes`` (``csrc/emulation/shim.cpp``) where ``binding.cpp``'s ops would be.
The library is built once per source hash into ``<cache>/emulated/<key>/`` (``<cache>``: ``$PAGED_CUDA_CACHE``
or ``~/.cache/paged/cuda``), by ``$CXX`` or ``g++``: about 10 s on two cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from paged_backend_cuda import build, kernels
from paged_core.api import AttentionMetadata, AttentionSpec, PagedError

SM_COUNT = 132
"""SMs the split plan assumes unless a call says otherwise (an H200's)."""
FLAGS: tuple[str, ...] = ("-x", "c++", "-O2", "-std=c++17", "-shared", "-fPIC", "-U_FORTIFY_SOURCE")
"""``-U_FORTIFY_SOURCE``: the fortified ``longjmp`` would refuse the emulator's switches between fiber stacks."""
SOURCES: tuple[str, ...] = (*build.KERNEL_SOURCES, "emulation/shim.cpp")
LIBRARY_NAME = "libpaged_cuda_emulated.so"
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""``DType`` of ``csrc/launch.h``."""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_args_type: type[ctypes.Structure] | None = None


def compiler() -> str:
    """The host C++ compiler: ``$CXX`` or ``g++``."""
    name = os.environ.get("CXX") or "g++"
    found = shutil.which(name)
    if found is None:
        raise PagedError(f"no C++ compiler {name!r} to build the emulated CUDA kernels (set CXX)")
    return found


def library_path(cxx: str) -> Path:
    """Where the library built by ``cxx`` from the current sources lives (it may not exist yet)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in build.csrc().rglob("*") if p.is_file() and p.name != build.BINDING_SOURCE):
        digest.update(str(path.relative_to(build.csrc())).encode() + b"\0" + path.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    digest.update(repr((FLAGS, cxx, version)).encode())
    return build.cache_root() / "emulated" / digest.hexdigest()[:16] / LIBRARY_NAME


def build_library() -> Path:
    """Compile ``attention.cu``, ``cache.cu`` and the shim into the cache (unless there already); returns the path."""
    cxx = compiler()
    target = library_path(cxx)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / LIBRARY_NAME
        cmd = [cxx, *FLAGS, *(str(build.csrc() / s) for s in SOURCES), "-o", str(staged)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise PagedError(f"building the emulated kernels failed: {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        os.replace(staged, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


def _read_args_type() -> type[ctypes.Structure]:
    """``AttentionArgs`` as a ctypes structure, its fields read from ``launch.h`` (so they are declared once)."""
    text = (build.csrc() / "launch.h").read_text()
    found = re.search(r"struct AttentionArgs \{(.*?)\};", text, re.S)
    if found is None:
        raise PagedError("launch.h declares no AttentionArgs")
    scalars = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}
    fields = [
        (name, ctypes.c_void_p if star else scalars[kind])
        for kind, star, name in re.findall(r"^\s*([\w ]+?)\s*(\*?)\s*(\w+);", found.group(1), re.M)
    ]
    return type("AttentionArgs", (ctypes.Structure,), {"_fields_": fields})


def load() -> ctypes.CDLL:
    """The emulated library, built first if needed and loaded once per process."""
    global _lib, _args_type
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(str(build_library()))
            ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
            lib.paged_emu_attention_args_size.restype = ctypes.c_size_t
            lib.paged_emu_write_kv.argtypes = [ptr, ptr, i64, i64, i64, i64, ptr, ptr, i32, i32, i32, i64, i32, i32]
            lib.paged_emu_copy_blocks.argtypes = [ptr, ptr, i32, i64, i64]
            for name in ("paged_emu_attention", "paged_emu_write_kv", "paged_emu_copy_blocks"):
                getattr(lib, name).restype = ctypes.c_char_p
            args_type = _read_args_type()
            if ctypes.sizeof(args_type) != lib.paged_emu_attention_args_size():
                raise PagedError("AttentionArgs as read from launch.h does not match the compiled struct")
            lib.paged_emu_attention.argtypes = [ctypes.POINTER(args_type), i32, i32]
            _lib, _args_type = lib, args_type
        return _lib


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(what)


def _raise_if(error: bytes | None) -> None:
    if error:
        raise RuntimeError(error.decode())


def _check_cache(kv_cache: torch.Tensor) -> None:
    _require(kv_cache.device.type == "cpu", "the emulated kernels take CPU tensors")
    _require(kv_cache.dim() == 5 and kv_cache.is_contiguous(), "kv_cache must be a contiguous 5-d tensor")


def _check_ints(t: torch.Tensor, what: str, dtype: torch.dtype) -> None:
    _require(t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous(), f"{what}: contiguous {dtype} on CPU")


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """:func:`kernels.write_kv` on CPU tensors: ``key``/``value`` ``[T, kv_heads, head]`` to their slots (-1: none)."""
    _write_kv_op(*kernels.kv_inputs(key, value), kv_cache, slot_mapping)


# The emulated launches as torch custom ops, as binding.cpp registers the real ones: a traced step
# (torch.compile, the conformance suite's host-read check) sees one opaque node per launch, never ctypes.
@torch.library.custom_op("paged_cuda_emulated::write_kv", mutates_args=("kv_cache",))
def _write_kv_op(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    lib = load()
    _check_cache(kv_cache)
    _check_ints(slot_mapping, "slot_mapping", torch.int64)
    tokens = slot_mapping.shape[0]
    _require(key.dim() == 3 and key.shape == value.shape and key.shape[0] == tokens, "key/value != [T, heads, dim]")
    _require(tuple(key.shape[1:]) == tuple(kv_cache.shape[3:]), "key shape != cache heads")
    _require(key.device.type == "cpu" and value.device.type == "cpu", "the emulated kernels take CPU tensors")
    _raise_if(
        lib.paged_emu_write_kv(
            key.data_ptr(),
            value.data_ptr(),
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            kv_cache.data_ptr(),
            slot_mapping.data_ptr(),
            tokens,
            kv_cache.shape[3],
            kv_cache.shape[4],
            kv_cache.shape[1] * kv_cache.shape[2],
            DTYPES[key.dtype],
            DTYPES[kv_cache.dtype],
        )
    )


@torch.library.custom_op("paged_cuda_emulated::copy_blocks", mutates_args=("kv_cache",))
def copy_blocks(kv_cache: torch.Tensor, src_to_dst: torch.Tensor) -> None:
    """:func:`kernels.copy_blocks` on CPU tensors: whole blocks, keys and values, for int64 ``[N, 2]`` pairs."""
    lib = load()
    _check_cache(kv_cache)
    _check_ints(src_to_dst, "src_to_dst", torch.int64)
    _require(src_to_dst.dim() == 2 and src_to_dst.shape[1] == 2, "src_to_dst must be [N, 2]")
    block_bytes = kv_cache[0, 0].numel() * kv_cache.element_size()
    _raise_if(
        lib.paged_emu_copy_blocks(
            kv_cache.data_ptr(), src_to_dst.data_ptr(), src_to_dst.shape[0], block_bytes, kv_cache.shape[1]
        )
    )


def attention_op(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    partial_out: torch.Tensor,
    partial_max: torch.Tensor,
    partial_sum: torch.Tensor,
    first_row: int,
    num_rows: int,
    max_query_len: int,
    num_splits: int,
    split_keys: int,
    rows_per_tile: int,
    scale: float,
    soft_cap: float,
    window: int,
    reduce_tokens: int,
) -> None:
    """``torch.ops.paged_cuda.attention`` on CPU tensors: binding.cpp's checks and ``AttentionArgs``, then the
    attention launch and, when it splits, the reduction over ``reduce_tokens`` tokens."""
    lib = load()
    assert _args_type is not None
    _check_cache(kv_cache)
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens)):
        _check_ints(t, name, torch.int32)
    _require(block_table.dtype == torch.int32 and block_table.stride(1) == 1, "block_table: int32, contiguous rows")
    _require(query.dim() == 3 and query.stride(2) == 1, "query must be [T, H, D] with a contiguous last dim")
    _require(out.is_contiguous() and out.dtype == query.dtype == kv_cache.dtype, "out, query, kv_cache: one dtype")
    _require(query.shape[2] == kv_cache.shape[4], "query head size != cache head size")
    _require(0 <= first_row and first_row + num_rows <= seq_lens.shape[0], "rows out of range")
    if num_splits > 1:
        need = reduce_tokens * query.shape[1] * num_splits
        _require(
            partial_out.numel() >= need * query.shape[2]
            and partial_max.numel() >= need
            and partial_sum.numel() >= need,
            "partial buffers too small",
        )
    fields = dict(
        query=query.data_ptr(),
        q_stride_token=query.stride(0),
        q_stride_head=query.stride(1),
        out=out.data_ptr(),
        key_cache=kv_cache.data_ptr(),
        value_cache=kv_cache[1].data_ptr(),
        query_start_loc=query_start_loc.data_ptr(),
        seq_lens=seq_lens.data_ptr(),
        block_table=block_table.data_ptr(),
        table_width=block_table.stride(0),
        first_row=first_row,
        num_rows=num_rows,
        max_query_len=max_query_len,
        num_heads=query.shape[1],
        num_kv_heads=kv_cache.shape[3],
        head_size=query.shape[2],
        block_size=kv_cache.shape[2],
        scale=scale,
        soft_cap=soft_cap,
        window=window,
        num_splits=num_splits,
        split_keys=split_keys,
        partial_out=partial_out.data_ptr() if num_splits > 1 else None,
        partial_max=partial_max.data_ptr() if num_splits > 1 else None,
        partial_sum=partial_sum.data_ptr() if num_splits > 1 else None,
        rows_per_tile=rows_per_tile,
    )
    _require(set(fields) == {f[0] for f in _args_type._fields_}, "AttentionArgs fields changed in launch.h")
    args = _args_type(**fields)
    _raise_if(lib.paged_emu_attention(ctypes.byref(args), DTYPES[query.dtype], reduce_tokens))


def attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    spec: AttentionSpec,
    sm_count: int = SM_COUNT,
) -> torch.Tensor:
    """:func:`kernels.attention` on CPU tensors, its decode splits planned for ``sm_count`` SMs."""
    return kernels.run_attention(_attention_op, sm_count, query, kv_cache, metadata, spec)


@torch.library.custom_op(
    "paged_cuda_emulated::attention", mutates_args=("out", "partial_out", "partial_max", "partial_sum")
)
def _attention_op(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    partial_out: torch.Tensor,
    partial_max: torch.Tensor,
    partial_sum: torch.Tensor,
    first_row: int,
    num_rows: int,
    max_query_len: int,
    num_splits: int,
    split_keys: int,
    rows_per_tile: int,
    scale: float,
    soft_cap: float,
    window: int,
    reduce_tokens: int,
) -> None:
    attention_op(
        out,
        query,
        kv_cache,
        query_start_loc,
        seq_lens,
        block_table,
        partial_out,
        partial_max,
        partial_sum,
        first_row,
        num_rows,
        max_query_len,
        num_splits,
        split_keys,
        rows_per_tile,
        scale,
        soft_cap,
        window,
        reduce_tokens,
    )


# Shape-only stand-ins for tracing (each op writes into tensors it was given and returns nothing).
@_write_kv_op.register_fake
def _(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    return None


@copy_blocks.register_fake
def _(kv_cache: torch.Tensor, src_to_dst: torch.Tensor) -> None:
    return None


@_attention_op.register_fake
def _(*args: object) -> None:
    return None
