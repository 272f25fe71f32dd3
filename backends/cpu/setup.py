"""Builds paged_backend_cpu._C, the C++ kernels, as a torch extension (the rest of the metadata is in pyproject.toml).

torch is imported only when the extension is compiled: making an sdist or reading the
metadata needs no torch, and torch is not a build requirement, so an isolated build (which
would install the newest torch, a CUDA build, only to compile against something other than
what runs it) stops at once with the instructions instead. The wheel requires the torch
minor it was compiled against: the C++ ABI of ATen changes between minors.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NAME = "paged_backend_cpu._C"
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.cpp"))
# PAGED_BUILD_DEBUG=1 keeps debug information (about 10 MB); releases ship stripped binaries.
DEBUG = os.environ.get("PAGED_BUILD_DEBUG", "0") == "1"
# One build for every x86-64 CPU: the ISA files pick their own instruction sets with
# `#pragma GCC target` and are chosen at run time, so no -march flag here.
# -fopenmp: without it ATen's at::parallel_for compiles to a serial loop (its OpenMP body sits
# under #ifdef _OPENMP), so every kernel here would run on one thread. The library then needs
# libgomp.so.1, which resolves to the copy torch has already loaded (or to Intel OpenMP's
# GOMP entry points when that is preloaded): one OpenMP runtime in the process.
COMPILE_ARGS = ["-O3", "-fno-math-errno", "-fopenmp", *([] if DEBUG else ["-g0"])]
LINK_ARGS = ["-fopenmp", *([] if DEBUG else ["-s"])]
CORE = "paged-core>=0.1,<0.3"  # plugin API 1: the cores implementing API 1 (0.1.x) or 2 (0.2.x)

NO_TORCH = (
    "paged-backend-cpu compiles against the torch it will run with, and no torch is importable here. "
    "Install torch for your machine first (for example: pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu), then build without isolation: "
    "pip install --no-build-isolation paged-backend-cpu"
)


def torch_requirement() -> str:
    """``torch>=X.Y,<X.(Y+1)`` for the installed torch (read from its metadata, not imported), else a range."""
    try:
        version = md.version("torch")
    except md.PackageNotFoundError:  # an sdist made without torch: the wheel built from it pins then
        return "torch>=2.4"
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return f"torch>={major}.{minor},<{major}.{minor + 1}"


class LazyTorchBuildExt(build_ext):
    """setuptools' ``build_ext`` until something is compiled (an sdist asks it for sources), then torch's."""

    def run(self) -> None:
        try:
            from torch.utils.cpp_extension import BuildExtension, CppExtension, is_ninja_available
        except ImportError as exc:
            raise SystemExit(f"error: {NO_TORCH} ({exc})") from exc
        # Give the declared extension the torch extension's settings (include and library paths, language,
        # flags), keeping what finalize_options already attached to it.
        torch_ext = CppExtension(NAME, SOURCES, extra_compile_args=COMPILE_ARGS, extra_link_args=LINK_ARGS)
        for ext in self.extensions:
            vars(ext).update(vars(torch_ext))
        # Become torch's command (a subclass of this one's base), with the attributes its constructor and
        # finalize_options would have set: ninja when there is one (it rebuilds only what changed).
        self.__class__ = BuildExtension  # type: ignore[assignment]
        self.no_python_abi_suffix = False
        self.use_ninja = bool(is_ninja_available())
        if self.use_ninja:
            self.force = True
        BuildExtension.run(self)


setup(
    install_requires=[CORE, torch_requirement()],
    # A plain Extension declares the native module (so wheels get platform tags) without torch;
    # LazyTorchBuildExt swaps in the torch extension when it runs.
    ext_modules=[Extension(NAME, SOURCES)],
    cmdclass={"build_ext": LazyTorchBuildExt},
)
