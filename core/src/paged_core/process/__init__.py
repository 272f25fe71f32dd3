"""Process helpers shared by the CLI, the engine core, its clients and tensor-parallel workers.

* :mod:`~paged_core.process.runtime`: the allocator and OpenMP preload, and children's environment.
* :mod:`~paged_core.process.logs`: logging set-up.
* :mod:`~paged_core.process.parent`: a child dies with its parent.
* :mod:`~paged_core.process.children`: take a child down, and say how it ended.

The lowest layer: nothing here imports another paged_core package.
"""
