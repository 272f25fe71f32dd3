"""The ``paged-conformance`` command: runs the suite's checks through pytest against one backend."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

SUITE_DIR = Path(__file__).resolve().parent / "suite"
"""Where the checks live (``check_*.py``) with the suite's own ``pytest.ini``."""


def pytest_args(
    backend: str,
    device: str | None = None,
    grid: str = "full",
    expect: str | None = None,
    json_path: str | None = None,
    junitxml: str | None = None,
    strict: bool = False,
    oracle: str = "auto",
    extra: Sequence[str] = (),
) -> list[str]:
    """The pytest command line that runs the suite with these options."""
    args = [
        str(SUITE_DIR),
        "-c",
        str(SUITE_DIR / "pytest.ini"),
        "--rootdir",
        str(SUITE_DIR),
        "-p",
        "paged_conformance.plugin",
        "--paged-backend",
        backend,
        "--paged-grid",
        grid,
        "--paged-oracle",
        oracle,
    ]
    if device:
        args += ["--paged-device", device]
    if expect:
        args += ["--paged-expect", expect]
    if json_path:
        args += ["--paged-json", json_path]
    if junitxml:
        args += ["--junitxml", junitxml]
    if strict:
        args.append("--paged-strict")
    return [*args, *extra]


def run(backend: str, **options: object) -> int:
    """Run the suite in this process; returns pytest's exit code (0 only when nothing failed).

    Takes the keyword options of :func:`pytest_args`.
    """
    return int(pytest.main(pytest_args(backend, **options)))  # type: ignore[arg-type]


def version_line() -> str:
    """What ``--version`` prints: this suite's version and plugin API next to the core it runs on."""
    from importlib import metadata

    from paged_core.api import PLUGIN_API_VERSION

    try:
        own = metadata.version("paged-conformance")
    except metadata.PackageNotFoundError:  # a source tree on sys.path
        own = "unknown"
    import paged_core

    return (
        f"paged-conformance {own} (checks plugin API {PLUGIN_API_VERSION}) "
        f"on paged-core {paged_core.__version__} (plugin API {PLUGIN_API_VERSION})"
    )


def _parser() -> argparse.ArgumentParser:
    # Raw description formatting keeps --version on one line (argparse otherwise wraps it to the terminal).
    parser = argparse.ArgumentParser(
        prog="paged-conformance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run",
        help="run the conformance suite against one backend",
        epilog="Arguments after `--` go to pytest unchanged (e.g. -- -k decode -x).",
    )
    r.add_argument("--backend", required=True, help="registered backend name, or package.module:ClassName")
    r.add_argument(
        "--device",
        default=None,
        help="device to test on (default: the backend's own); DEV-interpret, e.g. cpu-interpret, runs "
        "Triton kernels on DEV in the Triton interpreter (sets TRITON_INTERPRET=1)",
    )
    r.add_argument("--grid", choices=("quick", "full"), default="full", help="grid size (default: full)")
    r.add_argument("--quick", action="store_const", const="quick", dest="grid", help="same as --grid quick")
    r.add_argument(
        "--oracle",
        choices=("auto", "reference", "dense"),
        default="auto",
        help="compare against the reference backend or a dense computation (default: auto)",
    )
    r.add_argument("--expect", default=None, metavar="FILE", help="TOML file of expected failures and skips")
    r.add_argument("--json", default=None, metavar="FILE", help="write the JSON report to FILE")
    r.add_argument("--junitxml", default=None, metavar="FILE", help="write a JUnit XML report to FILE")
    r.add_argument("--strict", action="store_true", help="stale expectations fail the run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``paged-conformance`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    ns = _parser().parse_args(argv)
    if ns.expect and not Path(ns.expect).is_file():
        print(f"paged-conformance: expectations file {ns.expect!r} does not exist", file=sys.stderr)
        return 4
    return run(
        ns.backend,
        device=ns.device,
        grid=ns.grid,
        expect=ns.expect,
        json_path=ns.json,
        junitxml=ns.junitxml,
        strict=ns.strict,
        oracle=ns.oracle,
        extra=extra,
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
