"""paged-bench: the benchmark harness behind ``paged bench`` (the fixed, seeded workloads named in the design
brief, the same-process baselines, the vLLM and llama.cpp drivers and the serving benchmark).

Installed by ``paged-core[bench]``; it imports paged_core, never the other way round (paged-core's
``paged_core.cli.bench`` hands the ``bench`` subcommand to :mod:`paged_bench.cli`).
"""
