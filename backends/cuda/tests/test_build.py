"""The build's flags, cache key and tool discovery, and one real compile and link (no GPU needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from paged_backend_cuda import build
from paged_backend_cuda.backend import HEAD_SIZES
from paged_core.api import PagedError


def test_every_architecture_and_the_ptx_are_targets() -> None:
    flags = " ".join(build.gencode())
    for arch in ("80", "86", "89", "90a"):
        assert f"arch=compute_{arch},code=sm_{arch}" in flags
    assert "arch=compute_90,code=compute_90" in flags


def test_declared_head_sizes_are_the_compiled_ones() -> None:
    """The backend declares exactly the head sizes launch.h lists and attention.cu dispatches."""
    header = (build.csrc() / "launch.h").read_text()
    found = re.search(r"kHeadSizes\[\] = \{([^}]*)\}", header)
    assert found is not None
    listed = {int(n) for n in found.group(1).split(",")}
    source = (build.csrc() / "attention.cu").read_text()
    dispatched = {int(n) for n in re.findall(r"case (\d+): return by_rows", source)}
    assert listed == dispatched == set(HEAD_SIZES)


def test_cache_key_follows_sources_and_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "csrc"
    shutil.copytree(build.csrc(), copy)
    monkeypatch.setattr(build, "csrc", lambda: copy)
    before = build.build_key(build.ARCHITECTURES, "90")
    assert build.build_key(("80",), "90") != before
    (copy / "attention.cu").write_text((copy / "attention.cu").read_text() + "\n// changed\n")
    assert build.build_key(build.ARCHITECTURES, "90") != before


def test_library_and_nvcc_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libpaged_cuda.so"
    monkeypatch.setenv(build.LIBRARY_ENV, str(lib))
    assert build.find_library() is None  # named but missing
    lib.write_bytes(b"")
    assert build.find_library() == lib
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(build.NVCC_ENV, str(fake))
    assert build.find_nvcc() == fake


def test_build_without_nvcc_says_what_would_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    with pytest.raises(PagedError, match=r"no nvcc found.*CUDA_HOME.*paged-backend-cuda\[nvcc\]"):
        build.build()


@pytest.mark.slow
@pytest.mark.skipif(build.find_nvcc() is None, reason="needs nvcc (the CI machine has it)")
def test_the_library_compiles_and_links_with_the_torch_shim_left_to_load_time(tmp_path: Path) -> None:
    """One real build (sm_80 only, to keep it short): a shared library whose only torch dependency is the
    stable C shim (aoti_torch_*), resolved when a CUDA torch loads it; every kernel in the fatbin."""
    lib = build.build(("80",), None, tmp_path / "libpaged_cuda.so")
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True).stdout
    assert "aoti_torch_get_current_cuda_stream" in undefined
    assert not re.search(r"\bU _ZN(?:2at|3c10)", undefined), "links to torch's C++ API, not the stable ABI"
    kernels = subprocess.run(["nm", "-C", str(lib)], capture_output=True, text=True).stdout
    for name in ("attention_kernel", "reduce_kernel", "write_kv_kernel", "copy_blocks_kernel"):
        assert name in kernels
