"""``paged bench``: the benchmark harness, which lives in its own distribution, paged-bench (``paged-core[bench]``).

This is paged-core's one import of ``paged_bench``: the subcommand's parser and run come from
:mod:`paged_bench.cli`. Without paged-bench the import fails here, while the parser is built, and
``paged bench`` answers with the one-line hint to install ``paged-core[bench]`` (see ``cli/main.py``).
"""

from __future__ import annotations

from typing import Any

EXTRA = "bench"
"""The optional part of paged-core this subcommand needs (``paged-core[bench]``, which installs paged-bench)."""


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand that paged-bench defines."""
    from paged_bench.cli import register as register_bench

    register_bench(subparsers)
