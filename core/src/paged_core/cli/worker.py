"""``paged worker``: one tensor-parallel rank (1..N-1) on this machine, joining rank 0 through the environment.

For ranks on several machines: rank 0 is the engine core (``paged serve`` or ``paged generate``
with ``--tensor-parallel-size N --distributed-init env``); every other rank is a ``paged worker``.
All read ``MASTER_ADDR`` (rank 0's address), ``MASTER_PORT``, ``WORLD_SIZE`` (= N) and ``RANK``
from the environment, as torchrun sets them. A worker takes rank 0's engine configuration from the
rendezvous (so the ranks cannot disagree); only the model's path may differ on this machine.
"""

from __future__ import annotations

import argparse
from typing import Any

EXTRA = "models"
"""The optional part of paged-core this subcommand needs (``paged-core[models]``)."""


def register(subparsers: Any) -> None:
    """Add the ``worker`` subcommand."""
    parser = subparsers.add_parser(
        "worker",
        help="run one tensor-parallel rank (1..N-1) joining rank 0 via MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK",
        description="Join a tensor-parallel group formed through the environment and run rank 0's step plans "
        "with rank 0's engine configuration.",
    )
    parser.add_argument("--model", default=None, help="the model's path on this machine (default: rank 0's path)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for rank 0 to come up (default 300)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log set-up")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the launch, then serve as this rank until rank 0 quits or goes away."""
    from paged_core.engine_core.tp_worker import fetch_config, run_worker
    from paged_core.errors import ConfigError
    from paged_core.parallel.rendezvous import env_rendezvous
    from paged_core.process.logs import setup_logging

    setup_logging(args.verbose)
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}")
    rdv = env_rendezvous(None)
    if rdv.rank == 0:
        raise ConfigError(
            "RANK=0 is the engine core's rank: launch it with `paged serve` or `paged generate`; "
            "paged worker runs ranks 1..N-1"
        )
    config = fetch_config(rdv, args.timeout)
    if config.parallel.distributed_init != "env":
        raise ConfigError(
            "rank 0 runs distributed_init='local' (it starts its own workers); launch it with "
            "--distributed-init env to take ranks from paged worker"
        )
    if args.model is not None:
        config = config.replace(model=args.model)
    return run_worker(config, rdv)
