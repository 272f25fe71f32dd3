"""Finding IPEX's op library without importing IPEX's Python package, and the reasons given when it fails."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from paged_backend_xpu import ipex_library


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    ipex_library._load.cache_clear()
    yield
    ipex_library._load.cache_clear()


def _fake_ipex(root: Path, version: str, library: str | None) -> Path:
    """An installed-looking IPEX under ``root``: a package that must never be imported, metadata, a library."""
    package = root / ipex_library.PACKAGE
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the IPEX package was imported')\n")
    info = root / f"intel_extension_for_pytorch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {ipex_library.DISTRIBUTION}\nVersion: {version}\n")
    if library is not None:
        (package / "lib" / library).write_bytes(b"not an ELF file")
    return package


def _this_torch() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2]) + ".0"


def test_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ipex_library, "package_dir", lambda: None)
    reason = ipex_library.missing_reason()
    assert reason is not None and reason.startswith("intel-extension-for-pytorch is not installed: pip install")
    with pytest.raises(ipex_library.IpexUnavailableError, match=r"torch==2\.8\.0"):
        ipex_library.ops()
    assert ipex_library.describe().startswith("IPEX unavailable: ")


def test_found_without_import_and_torch_mismatch_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _fake_ipex(tmp_path, "2.8.0+cpu", ipex_library.CPU_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    loaded: list[str] = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    assert ipex_library.package_dir() == package
    assert ipex_library.ipex_version() == "2.8.0+cpu"
    assert ipex_library.library_path() == package / "lib" / ipex_library.CPU_LIBRARY
    reason = ipex_library.missing_reason()
    assert reason is not None and "built for torch 2.8.x, this is torch 2.13.0+cpu" in reason
    assert not loaded  # a library for another torch is never loaded
    assert ipex_library.PACKAGE not in sys.modules


def test_xpu_build_without_the_cpu_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ipex(tmp_path, _this_torch(), ipex_library.XPU_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = ipex_library.missing_reason()
    assert reason is not None and f"has no lib/{ipex_library.CPU_LIBRARY}" in reason
    assert ipex_library.XPU_LIBRARY in reason


def test_unloadable_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ipex(tmp_path, _this_torch(), ipex_library.CPU_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = ipex_library.missing_reason()
    assert reason is not None and reason.startswith("loading ") and "failed" in reason
    assert "pip install torch==2.8.0" in reason
    assert ipex_library.PACKAGE not in sys.modules


def test_library_without_the_paged_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ipex(tmp_path, _this_torch(), ipex_library.CPU_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)  # "loads", registers nothing
    reason = ipex_library.missing_reason()
    assert reason is not None and "registers no torch.ops.torch_ipex.reshape_and_cache" in reason


def test_minor_version() -> None:
    assert ipex_library._minor("2.8.0+cpu") == (2, 8)
    assert ipex_library._minor("2.13.0") == (2, 13)
