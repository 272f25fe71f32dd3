"""paged-triton: the Triton source of paged attention shared by the ROCm, XPU (and any other) backends.

One kernel source (:mod:`paged_triton.attention_kernels`, :mod:`paged_triton.cache_kernels`), tiles and launch
options per device family (:mod:`paged_triton.tiles`), launchers that compute grids from host ints only
(:mod:`paged_triton.launch`), the same launches as torch custom ops for graph capture (:mod:`paged_triton.ops`),
and the list of every specialization a family launches, for ahead-of-time resource reports
(:mod:`paged_triton.specializations`). A backend imports these and ``paged_core.api``, nothing else.

Importing the package does not import triton: the kernels load on first use, after a backend's interpreter
switch had its chance to set ``TRITON_INTERPRET``.
"""

from __future__ import annotations
