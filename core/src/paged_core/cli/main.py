"""The ``paged`` command: argparse with one module per subcommand.

Adding a subcommand is a one-file change: drop a module into
``paged_core/cli/`` that defines ``register(subparsers)``; it must add its
parser and ``set_defaults(func=run)`` where ``run(args) -> int``. Modules are
imported at every start, so keep heavy imports (torch models, servers)
inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

import paged_core.cli as cli_package
from paged_core.cli import runtime
from paged_core.errors import PagedError


def _version() -> str:
    try:
        return md.version("paged-core")
    except md.PackageNotFoundError:
        return "unknown"


def subcommand_modules() -> list[ModuleType]:
    """Every module of this package that exposes ``register``, in name order."""
    modules = []
    for info in sorted(pkgutil.iter_modules(cli_package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "main":
            continue
        module = importlib.import_module(f"{cli_package.__name__}.{info.name}")
        if callable(getattr(module, "register", None)):
            modules.append(module)
    return modules


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand registered."""
    parser = argparse.ArgumentParser(prog="paged", description="Paged-attention LLM serving with pluggable backends.")
    parser.add_argument("--version", action="version", version=f"paged-core {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in subcommand_modules():
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting (the console script exits with it).

    Started from the command line (``argv`` None), the heavy subcommands first re-execute the
    process with tcmalloc and Intel OpenMP preloaded (:mod:`paged_core.cli.runtime`;
    ``PAGED_RUNTIME=0`` turns that off).
    """
    if argv is None:
        runtime.maybe_reexec()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else 2
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except PagedError as exc:  # expected user-facing failures: one line, no traceback
        print(f"paged {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C after a clean shutdown (uvicorn re-raises the signal it caught)
        return 130


if __name__ == "__main__":
    sys.exit(main())
