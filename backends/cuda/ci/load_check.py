"""Load the kernels into a CUDA build of torch on a machine without a GPU: symbols, op schemas, dispatch.

Run by ``ci/cuda`` with a separate environment's python (a CUDA torch; the project's own environment has the CPU
build, which lacks ``libtorch_cuda``)::

    PYTHONPATH=core/src:backends/cuda/src CUDA_VENV/bin/python backends/cuda/ci/load_check.py

Builds the library for sm_90a against that torch, loads it (every stable-ABI symbol must resolve), checks the
three ops' schemas, that CPU tensors are refused by the dispatcher (the kernels are registered for CUDA only),
and that the fake implementations let a traced step run on fake CUDA tensors. Exit 0 when all hold.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

from paged_backend_cuda import build

SCHEMAS = {
    "write_kv": "(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()",
    "copy_blocks": "(Tensor(a!) kv_cache, Tensor src_to_dst) -> ()",
    "attention": "(Tensor(a!) out, Tensor query, Tensor kv_cache,",
}


def main() -> int:
    if not torch.version.cuda:
        print(f"load_check: torch {torch.__version__} is not a CUDA build", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        lib = build.build(("90a",), None, Path(tmp) / build.LIBRARY_NAME)
        from paged_backend_cuda import kernels

        os.environ[build.LIBRARY_ENV] = str(lib)
        kernels.load()  # torch.ops.load_library + the fake implementations
    for op, schema in SCHEMAS.items():
        got = str(getattr(torch.ops.paged_cuda, op).default._schema)
        assert schema in got, f"{op}: {got}"
        print(f"ok: {got[:110]}")
    try:
        torch.ops.paged_cuda.write_kv(
            torch.zeros(1, 1, 64),
            torch.zeros(1, 1, 64),
            torch.zeros(2, 1, 16, 1, 64),
            torch.zeros(1, dtype=torch.int64),
        )
        raise AssertionError("CPU tensors were accepted")
    except NotImplementedError as exc:
        assert "CPU" in str(exc)
        print("ok: CPU tensors refused by the dispatcher (CUDA kernels only)")
    with torch._subclasses.fake_tensor.FakeTensorMode():
        cache = torch.empty(2, 4, 16, 2, 64, device="cuda")
        key = torch.empty(3, 2, 64, device="cuda")
        torch.ops.paged_cuda.write_kv(key, key, cache, torch.empty(3, dtype=torch.int64, device="cuda"))
    print(f"ok: fake implementations; torch {torch.__version__}, library built and loaded without a GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
