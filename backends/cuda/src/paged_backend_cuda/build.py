"""Compiling the kernels: nvcc flags, architectures, and the per-machine library cache.

The kernels (``csrc/*.cu``) know nothing of torch; ``csrc/binding.cpp`` registers them as ``torch.ops.paged_cuda``
through the LibTorch stable ABI, built with ``TORCH_TARGET_VERSION`` 2.10, so one library serves every torch
from 2.10 on and the wheel stays pure Python. The library is built once per machine, at first use or by
``python -m paged_backend_cuda.build``, into ``$PAGED_CUDA_CACHE`` (default ``~/.cache/paged/cuda``) under a
key of the sources and flags; ``$PAGED_CUDA_LIBRARY`` names a prebuilt one instead.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from paged_core.api import PagedError

ARCHITECTURES: tuple[str, ...] = ("80", "86", "89", "90a")
"""SASS targets: A100, RTX 30xx/A10/A40, RTX 40xx/L4/L40, H100/H200."""
PTX_ARCHITECTURE = "90"
"""Also embedded as PTX, which newer GPUs compile at load time."""
KERNEL_SOURCES: tuple[str, ...] = ("attention.cu", "cache.cu")
BINDING_SOURCE = "binding.cpp"
TORCH_TARGET_VERSION = "(((0ULL+2)<<56)|((0ULL+10)<<48))"
"""The stable-ABI level the binding is written against: torch 2.10."""
NVCC_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC")
LIBRARY_NAME = "libpaged_cuda.so"
LIBRARY_ENV = "PAGED_CUDA_LIBRARY"
CACHE_ENV = "PAGED_CUDA_CACHE"
NVCC_ENV = "PAGED_CUDA_NVCC"


def csrc() -> Path:
    """The folder of the CUDA and C++ sources (package data)."""
    return Path(__file__).resolve().parent / "csrc"


def find_nvcc() -> Path | None:
    """nvcc from ``$PAGED_CUDA_NVCC``, ``$CUDA_HOME``, ``PATH``, or PyPI's ``nvidia-cuda-nvcc`` wheel."""
    candidates: list[Path] = []
    if os.environ.get(NVCC_ENV):
        candidates.append(Path(os.environ[NVCC_ENV]))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home:
            candidates.append(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        candidates.append(Path(found))
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations or [] if spec else []:
        candidates.extend(sorted(Path(root).glob("*/bin/nvcc")))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def gencode(architectures: Sequence[str] = ARCHITECTURES, ptx: str | None = PTX_ARCHITECTURE) -> list[str]:
    """``-gencode`` flags: SASS for each architecture, plus PTX for ``ptx``."""
    flags = []
    for arch in architectures:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    if ptx:
        flags += ["-gencode", f"arch=compute_{ptx},code=compute_{ptx}"]
    return flags


def torch_include() -> Path:
    """The installed torch's headers (the stable ABI's are header-only)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise PagedError("torch is not installed")
    return Path(spec.origin).parent / "include"


def torch_libraries() -> list[str]:
    """Link flags for the installed torch's libraries that define the stable ABI's C shim.

    Linked by file name (no version), as torch's own extension builder does: the loader finds them already
    loaded by ``import torch``. ``libtorch_cuda`` (the current-stream call) exists only in CUDA builds of torch;
    without it (a CPU torch, which cannot run the kernels anyway) the symbol stays unresolved until loaded.
    """
    lib = torch_include().parent / "lib"
    names = ["c10", "torch", "torch_cpu"] + [n for n in ("c10_cuda", "torch_cuda") if (lib / f"lib{n}.so").is_file()]
    return [f"-L{lib}", *(f"-l{n}" for n in names)]


def build_key(architectures: Sequence[str], ptx: str | None) -> str:
    """A digest of every source and flag, so a changed kernel or target never reuses an old library."""
    digest = hashlib.sha256()
    for path in sorted(p for p in csrc().iterdir() if p.is_file()):  # csrc/emulation/ is not in this build
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(repr((NVCC_FLAGS, tuple(architectures), ptx, TORCH_TARGET_VERSION)).encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "paged" / "cuda")


def cached_library(architectures: Sequence[str] = ARCHITECTURES, ptx: str | None = PTX_ARCHITECTURE) -> Path:
    """Where the library for these targets lives in the cache (it may not exist yet)."""
    return cache_root() / build_key(architectures, ptx) / LIBRARY_NAME


def find_library() -> Path | None:
    """``$PAGED_CUDA_LIBRARY``, or the cached build of the default targets, if present."""
    if os.environ.get(LIBRARY_ENV):
        path = Path(os.environ[LIBRARY_ENV])
        return path if path.is_file() else None
    path = cached_library()
    return path if path.is_file() else None


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise PagedError(f"building the CUDA kernels failed: {' '.join(cmd)}\n{done.stdout}{done.stderr}")


def build(
    architectures: Sequence[str] = ARCHITECTURES,
    ptx: str | None = PTX_ARCHITECTURE,
    destination: Path | None = None,
    nvcc: Path | None = None,
    threads: int = 0,
) -> Path:
    """Compile and link the library; returns its path (the cache entry unless ``destination`` is given).

    ``threads``: nvcc's ``--threads`` (targets compiled in parallel; 0 = one per CPU).
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise PagedError(
            "no nvcc found to build the CUDA kernels: install the CUDA toolkit (or set CUDA_HOME), "
            f"`pip install 'paged-backend-cuda[nvcc]'`, or point {LIBRARY_ENV} at a prebuilt {LIBRARY_NAME}"
        )
    target = destination or cached_library(architectures, ptx)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        objects = []
        for source in KERNEL_SOURCES:
            obj = work / (source + ".o")
            _run(
                [
                    str(nvcc),
                    *NVCC_FLAGS,
                    "--threads",
                    str(threads),
                    *gencode(architectures, ptx),
                    "-c",
                    str(csrc() / source),
                    "-o",
                    str(obj),
                ]
            )
            objects.append(str(obj))
        binding = work / (BINDING_SOURCE + ".o")
        _run(
            [
                str(nvcc),
                *NVCC_FLAGS,
                "-DUSE_CUDA",
                f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}",
                f"-I{torch_include()}",
                "-c",
                str(csrc() / BINDING_SOURCE),
                "-o",
                str(binding),
            ]
        )
        staged = work / LIBRARY_NAME
        # The CUDA runtime linked statically: the library needs no libcudart of a particular version, and the
        # aoti_torch_* symbols stay undefined until torch loads it.
        _run([str(nvcc), "-shared", "-cudart", "static", *objects, str(binding), "-o", str(staged), *torch_libraries()])
        os.replace(staged, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m paged_backend_cuda.build``: build (or find) the library and print its path."""
    parser = argparse.ArgumentParser(prog="python -m paged_backend_cuda.build", description=__doc__)
    parser.add_argument("--arch", default=",".join(ARCHITECTURES), help="comma-separated SASS targets")
    parser.add_argument("--ptx", default=PTX_ARCHITECTURE, help="PTX target ('' for none)")
    parser.add_argument("--out", default=None, help="write the library here instead of the cache")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    ns = parser.parse_args(argv)
    archs = [a for a in ns.arch.split(",") if a]
    cached = cached_library(archs, ns.ptx or None)
    if ns.out is None and cached.is_file() and not ns.force:
        print(cached)
        return 0
    print(build(archs, ns.ptx or None, Path(ns.out) if ns.out else None))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
