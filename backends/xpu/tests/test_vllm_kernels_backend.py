"""VllmXpuKernelsBackend on a machine without an Intel GPU: availability, refusals, the envelope, the loader.

The loader is driven against a fake ``vllm_xpu_kernels`` package written to a temporary directory (the real
wheel links ``libtorch_xpu``/``libsycl`` and cannot be imported into a CPU torch).
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from paged_backend_xpu import environment, vllm_kernels_backend
from paged_backend_xpu.vllm_kernels_backend import INSTALL_HINT, VllmXpuKernelsBackend, load_library
from paged_core.api import (
    AttentionSpec,
    DeviceGraphStrategy,
    EagerStrategy,
    GraphSupport,
    PagedError,
    UnsupportedConfigError,
)

no_xpu = pytest.mark.skipif(environment.no_xpu_reason() is None, reason="checks a machine without an Intel GPU")


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``vllm_xpu_kernels`` unfindable, whatever is installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm_xpu_kernels" else real(name, *a)
    )


@pytest.fixture
def gpu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch.xpu sees an Intel GPU."""
    monkeypatch.setattr(environment, "no_xpu_reason", lambda: None)


def fake_package(root: Path, interface: str, c_module: str = "") -> None:
    """Write a ``vllm_xpu_kernels`` package (and its dist-info) under ``root``."""
    pkg = root / "vllm_xpu_kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .flash_attn_interface import flash_attn_varlen_func  # noqa: F401\n")
    (pkg / "flash_attn_interface.py").write_text(textwrap.dedent(interface))
    (pkg / "_C.py").write_text(textwrap.dedent(c_module))
    info = root / "vllm_xpu_kernels-0.1.16.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: vllm-xpu-kernels\nVersion: 0.1.16.2\n")


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A sys.path entry for a fake package; its modules are dropped from sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "vllm_xpu_kernels" or m.startswith("vllm_xpu_kernels.")]:
        del sys.modules[name]


GOOD_INTERFACE = """
    FA2_AVAILABLE = True
    FA2_UNAVAILABLE_REASON = None

    def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, **kwargs):
        return "called"
"""


@no_xpu
def test_unavailable_here_with_the_xpu_reason() -> None:
    """Without an Intel GPU: unavailable on 'xpu', with the environment's reason."""
    avail = VllmXpuKernelsBackend.availability()
    assert not avail.available and avail.device == "xpu"
    assert avail.reason == environment.no_xpu_reason()


def test_missing_library_is_the_reason_with_a_gpu(gpu_here: None, no_library: None) -> None:
    """With a usable GPU but no library, the reason is the install hint (and names the torch it needs)."""
    avail = VllmXpuKernelsBackend.availability()
    assert not avail.available and avail.device == "xpu" and avail.reason == INSTALL_HINT
    assert "pip install vllm-xpu-kernels" in avail.reason and "torch 2.14.0+xpu" in avail.reason


def test_available_with_gpu_and_library(gpu_here: None, monkeypatch: pytest.MonkeyPatch, no_library: None) -> None:
    """Both present: available on 'xpu' (the library is found, not imported)."""
    monkeypatch.setattr(vllm_kernels_backend, "missing_library", lambda: None)
    avail = VllmXpuKernelsBackend.availability()
    assert avail.available and avail.device == "xpu"


@no_xpu
def test_construction_is_refused_here() -> None:
    """A CPU-only machine cannot construct it on 'xpu', whatever is installed."""
    with pytest.raises(PagedError, match="cannot run here: "):
        VllmXpuKernelsBackend()


def test_other_devices_are_refused() -> None:
    """Any device but 'xpu' is refused by name before anything is loaded."""
    for device in ("cpu", "meta"):
        with pytest.raises(PagedError, match=r"runs on Intel GPUs \(device 'xpu'\), not on"):
            VllmXpuKernelsBackend(device)


def test_construction_without_library_is_refused(gpu_here: None, no_library: None) -> None:
    """With a GPU but no library, construction raises the install hint."""
    with pytest.raises(PagedError, match="vllm-xpu-kernels is not installed: `pip install vllm-xpu-kernels`"):
        VllmXpuKernelsBackend("xpu")


def test_declared_envelope() -> None:
    """bf16/fp16, heads 64/128, blocks 64/128/256, GQA up to 8, window, no soft cap, uniform-decode graphs."""
    caps = VllmXpuKernelsBackend.capabilities()
    cls = VllmXpuKernelsBackend
    assert (cls.name, cls.api_version, cls.priority) == ("xpu-vllm-kernels", 1, 65)
    assert caps.dtypes == caps.effective_kv_cache_dtypes == {torch.bfloat16, torch.float16}
    assert caps.head_sizes == frozenset({64, 128}) and caps.block_sizes == (64, 128, 256)
    assert caps.gqa_ratios == frozenset(range(1, 9))
    assert caps.sliding_window and not caps.logits_soft_cap
    assert caps.graph_support == GraphSupport.UNIFORM_DECODE


def test_envelope_check_accepts_and_refuses() -> None:
    """Every declared combination is accepted; fp32, head 96, block 16/32, GQA 16 and soft cap are refused."""
    caps = VllmXpuKernelsBackend.capabilities()
    for head in (64, 128):
        for block in caps.block_sizes:
            for dtype in caps.dtypes:
                caps.check(AttentionSpec(8, 1, head, sliding_window=7), dtype, block)
    refused = [
        (AttentionSpec(8, 8, 64), torch.float32, 64),
        (AttentionSpec(8, 8, 96), torch.bfloat16, 64),
        (AttentionSpec(8, 8, 64), torch.bfloat16, 16),
        (AttentionSpec(8, 8, 64), torch.bfloat16, 32),
        (AttentionSpec(16, 1, 64), torch.bfloat16, 64),
        (AttentionSpec(8, 8, 64, logits_soft_cap=30.0), torch.bfloat16, 64),
    ]
    for spec, dtype, block in refused:
        with pytest.raises(UnsupportedConfigError):
            caps.check(spec, dtype, block)


def test_graph_strategy_on_xpu_is_xpu_graphs() -> None:
    """On an 'xpu' device the strategy is DeviceGraphStrategy('xpu') (checked without constructing on a GPU)."""
    backend = VllmXpuKernelsBackend.__new__(VllmXpuKernelsBackend)
    backend.device = torch.device("xpu")
    strategy = backend.graph_strategy()
    assert isinstance(strategy, DeviceGraphStrategy) and strategy.device_type == "xpu"
    backend.device = torch.device("cpu")
    assert isinstance(backend.graph_strategy(), EagerStrategy)


def test_load_library_binds_the_two_calls(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader imports the interface and ``_C`` (which registers the cache ops) and binds both calls."""
    fake_package(fake_root, GOOD_INTERFACE, c_module="import sys\nsys.modules[__name__].LOADED = True\n")
    op = SimpleNamespace(reshape_and_cache_flash=lambda *args: None)
    monkeypatch.setattr(torch.ops, "_C_cache_ops", op, raising=False)
    lib = load_library()
    assert lib.version == "0.1.16.2"
    assert lib.reshape_and_cache_flash is op.reshape_and_cache_flash
    assert lib.flash_attn_varlen_func(None, None, None, 1, None, 1) == "called"
    assert sys.modules["vllm_xpu_kernels._C"].LOADED


def test_load_library_reports_an_import_failure(fake_root: Path) -> None:
    """A library built for another torch fails at import: the error names this torch and the one it needs."""
    fake_package(fake_root, GOOD_INTERFACE, c_module="raise ImportError('libsycl.so.9: cannot open shared object')\n")
    with pytest.raises(
        PagedError, match=r"importing vllm_xpu_kernels failed under torch .*libsycl\.so\.9.*2\.14\.0\+xpu"
    ):
        load_library()


def test_load_library_reports_a_swallowed_attention_import(fake_root: Path) -> None:
    """The wrapper catches the failed import of its attention extension; the loader surfaces the reason."""
    interface = """
        FA2_AVAILABLE = False
        FA2_UNAVAILABLE_REASON = "undefined symbol: _ZN3c10"

        def flash_attn_varlen_func(*args, **kwargs):
            raise AssertionError("never called")
    """
    fake_package(fake_root, interface)
    with pytest.raises(PagedError, match="attention library did not load: undefined symbol: _ZN3c10"):
        load_library()


def test_load_library_without_the_package(no_library: None) -> None:
    """Nothing installed: the install hint."""
    with pytest.raises(PagedError, match="pip install vllm-xpu-kernels"):
        load_library()
