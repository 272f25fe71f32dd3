"""Find and load IPEX's op library without importing ``intel_extension_for_pytorch``.

IPEX's Python package patches transformers 4.x at import and dies on transformers 5, which paged-core
requires. Its paged ops do not need the package: they are registered by the C++ library under
``<package>/lib`` into ``torch.ops.torch_ipex`` once :func:`torch.ops.load_library` loads it. So this
module locates the installed package without executing it (``importlib.util.find_spec`` of a top-level
package only reads the file system) and loads the library itself.

IPEX 2.8.0 is the last release. Its wheels on PyPI are CPU builds and carry ``libintel-ext-pt-cpu.so``;
the XPU builds (Intel's own index) carry ``libintel-ext-pt-gpu.so`` as well, whose XPU paged ops are
other ones (``chunked_prefill``, ``reshape_and_cache_flash``, a ``[blocks, block, heads, dim]`` cache)
and are not used here. Every IPEX release links one torch minor version, so a mismatch is refused
before loading (a library built for another torch fails on undefined symbols, or worse).

:func:`ops` is the one way the backend reaches the ops, so tests replace it with a stand-in.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import torch

from paged_core.api import PagedError

PACKAGE = "intel_extension_for_pytorch"
DISTRIBUTION = "intel-extension-for-pytorch"
CPU_LIBRARY = "libintel-ext-pt-cpu.so"
"""The op library of IPEX's CPU builds (the PyPI wheels), relative to ``<package>/lib``."""
XPU_LIBRARY = "libintel-ext-pt-gpu.so"
"""The op library of IPEX's XPU builds (Intel's index); located for reports, not loaded (see module doc)."""
REQUIRED_OPS = ("reshape_and_cache", "flash_attn_varlen_func")
INSTALL_HINT = (
    "pip install torch==2.8.0 intel-extension-for-pytorch==2.8.0 in an environment of its own "
    "(IPEX 2.8.0 is the last release and pins torch 2.8; backends/xpu/ci/ipex_conformance.sh builds one)"
)
"""What makes this tier available, appended to every reason it is not."""


class IpexUnavailableError(PagedError):
    """IPEX's op library cannot be loaded here; the message says why and what would work."""


def package_dir() -> Path | None:
    """The installed ``intel_extension_for_pytorch`` folder, found without importing it (``None``: absent)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def ipex_version() -> str | None:
    """The installed distribution's version (``None`` when its metadata is missing)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_path(name: str = CPU_LIBRARY) -> Path | None:
    """``<package>/lib/<name>`` when that file exists."""
    root = package_dir()
    if root is None:
        return None
    path = root / "lib" / name
    return path if path.is_file() else None


def _minor(version: str) -> tuple[int, ...]:
    """``"2.8.0+cpu"`` -> ``(2, 8)``."""
    parts = version.split("+", 1)[0].split(".")[:2]
    return tuple(int(p) for p in parts if p.isdigit())


@functools.lru_cache(maxsize=1)
def _load() -> str | None:
    """Load the CPU op library once; the reason it cannot be loaded, or ``None``."""
    root = package_dir()
    if root is None:
        return f"{DISTRIBUTION} is not installed: {INSTALL_HINT}"
    version = ipex_version() or "unknown"
    if version != "unknown" and _minor(version) != _minor(torch.__version__):
        return (
            f"{DISTRIBUTION} {version} is built for torch {'.'.join(map(str, _minor(version)))}.x, "
            f"this is torch {torch.__version__}: {INSTALL_HINT}"
        )
    path = library_path(CPU_LIBRARY)
    if path is None:
        extra = " (an XPU build? it ships " + XPU_LIBRARY + ")" if library_path(XPU_LIBRARY) else ""
        return f"{DISTRIBUTION} {version} at {root} has no lib/{CPU_LIBRARY}{extra}: {INSTALL_HINT}"
    try:
        torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    except (OSError, RuntimeError) as exc:
        return f"loading {path} failed ({exc}): {INSTALL_HINT}"
    missing = [op for op in REQUIRED_OPS if not hasattr(torch.ops.torch_ipex, op)]
    if missing:
        return f"{path} loaded but registers no torch.ops.torch_ipex.{', '.join(missing)}: {INSTALL_HINT}"
    return None


def ops() -> Any:
    """``torch.ops.torch_ipex`` with the CPU library loaded; raises :class:`IpexUnavailableError` if it cannot be.

    Typed ``Any``: torch's op namespaces are dynamic.
    """
    why = _load()
    if why is not None:
        raise IpexUnavailableError(why)
    return torch.ops.torch_ipex


def missing_reason() -> str | None:
    """Why the IPEX ops cannot be used here (``None`` when :func:`ops` works)."""
    try:
        ops()
    except IpexUnavailableError as exc:
        return str(exc)
    return None


def describe() -> str:
    """One line for reports: the version, the library and whether it loads."""
    why = missing_reason()
    if why is not None:
        return f"IPEX unavailable: {why}"
    return f"{DISTRIBUTION} {ipex_version()} ops loaded from {library_path(CPU_LIBRARY)}"
