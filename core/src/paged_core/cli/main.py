"""The ``paged`` command: argparse with one module per subcommand.

Adding a subcommand is a one-file change: drop a module into
``paged_core/cli/`` that defines ``register(subparsers)``; it must add its
parser and ``set_defaults(func=run)`` where ``run(args) -> int``, and may set
``EXTRA`` to the paged-core extra it needs (``"models"``, ``"serve"``, ...).
Modules are imported at every start, so keep heavy imports (torch models,
servers) inside ``run``: a plain ``pip install paged-core`` lacks them, and
``paged`` then answers a subcommand whose extra is missing with a one-line hint.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import paged_core.cli as cli_package
from paged_core import extras
from paged_core._version import __version__
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.errors import PagedError
from paged_core.process import runtime


def version_line() -> str:
    """``paged-core X (plugin API N; accepts backends of API ...)``: what ``--version`` prints."""
    accepted = ", ".join(str(v) for v in sorted(SUPPORTED_PLUGIN_API_VERSIONS))
    return f"paged-core {__version__} (plugin API {PLUGIN_API_VERSION}; accepts backends of API {accepted})"


def _extra_of(func: object) -> str | None:
    module = sys.modules.get(getattr(func, "__module__", ""))
    extra = getattr(module, "EXTRA", None)
    return extra if isinstance(extra, str) else None


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
    # Raw description formatting keeps --version on one line (argparse otherwise wraps it to the terminal).
    parser = argparse.ArgumentParser(
        prog="paged",
        description="Paged-attention LLM serving with pluggable backends.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in subcommand_modules():
        try:
            module.register(subparsers)
        except ImportError as exc:  # its parser reads an optional module: keep the name, answer with the hint
            name = module.__name__.rpartition(".")[2]
            hint = extras.from_import_error(exc, f"paged {name}", _extra_of(module.register) or "all")
            if hint is None:
                raise
            _add_unavailable(subparsers, name, hint)
    return parser


def _add_unavailable(subparsers: Any, name: str, hint: extras.MissingExtraError) -> None:
    """A stand-in subcommand that takes any arguments and prints ``hint``."""

    def run(args: argparse.Namespace) -> int:
        raise hint

    # No option prefix: "--help" and any flag land in `rest` instead of being refused as unknown.
    parser = subparsers.add_parser(name, help=f"(needs paged-core[{hint.extra}])", add_help=False, prefix_chars="\0")
    parser.add_argument("rest", nargs="*")
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting (the console script exits with it).

    Started from the command line (``argv`` None), the heavy subcommands first re-execute the
    process with tcmalloc preloaded (:mod:`paged_core.process.runtime`; ``PAGED_RUNTIME=0`` turns
    that off, ``PAGED_RUNTIME=iomp`` adds Intel OpenMP).
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
    extra = _extra_of(func)
    feature = f"paged {args.command}"
    try:
        if extra is not None:
            extras.require(extra, feature)
        return int(func(args))
    except extras.MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ImportError as exc:  # an optional module the metadata check could not see (a source checkout)
        hint = extras.from_import_error(exc, feature, extra or "all")
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 1
    except PagedError as exc:  # expected user-facing failures: one line, no traceback
        print(f"paged {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C after a clean shutdown (uvicorn re-raises the signal it caught)
        return 130
    except BrokenPipeError:  # the reader went away (`paged backends | head -1`): no traceback, as a shell tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe stopped


if __name__ == "__main__":
    sys.exit(main())
