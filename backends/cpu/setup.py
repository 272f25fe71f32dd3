"""Builds paged_backend_cpu._C, the C++ kernels, as a torch extension (metadata lives in pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.cpp"))

setup(
    ext_modules=[
        CppExtension(
            "paged_backend_cpu._C",
            SOURCES,
            # One build for every x86-64 CPU: the ISA files pick their own instruction sets with
            # `#pragma GCC target` and are chosen at run time, so no -march flag here.
            # -fopenmp: without it ATen's at::parallel_for compiles to a serial loop (its OpenMP body sits
            # under #ifdef _OPENMP), so every kernel here would run on one thread. The library then needs
            # libgomp.so.1, which resolves to the copy torch has already loaded (or to Intel OpenMP's
            # GOMP entry points when that is preloaded): one OpenMP runtime in the process.
            extra_compile_args=["-O3", "-fno-math-errno", "-fopenmp"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
