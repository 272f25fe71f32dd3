"""The ``paged`` entry point: subcommand discovery, exit codes, one-line errors."""

from __future__ import annotations

import sys

import pytest

import paged_core.cli as cli_package
from paged_core.cli.main import build_parser, main, subcommand_modules


def test_backends_subcommand_is_discovered() -> None:
    assert "paged_core.cli.backends" in [m.__name__ for m in subcommand_modules()]
    assert "backends" in build_parser().format_help()


def test_no_command_prints_help_and_fails(capsys) -> None:
    assert main([]) == 2
    assert "usage: paged" in capsys.readouterr().err


def test_help_and_version_exit_zero(capsys) -> None:
    assert main(["--help"]) == 0
    assert main(["--version"]) == 0
    assert "paged-core" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_paged_error_becomes_one_line_and_exit_1(monkeypatch, capsys) -> None:
    monkeypatch.setenv("PAGED_DISABLE_PLUGINS", "perhaps")
    assert main(["backends"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "paged backends: error: PAGED_DISABLE_PLUGINS='perhaps' is not a boolean; use 1/true/yes/on or 0/false/no/off"
    )


@pytest.fixture
def extra_subcommand(tmp_path, monkeypatch):
    """Drop a new subcommand module next to the real ones, as a contributor would."""
    (tmp_path / "hello.py").write_text(
        "def register(subparsers):\n"
        "    p = subparsers.add_parser('hello')\n"
        "    p.add_argument('who')\n"
        "    p.set_defaults(func=lambda args: print('hello', args.who) or 7)\n"
    )
    monkeypatch.setattr(cli_package, "__path__", [*cli_package.__path__, str(tmp_path)])
    yield
    sys.modules.pop("paged_core.cli.hello", None)


def test_adding_a_subcommand_is_one_file(extra_subcommand, capsys) -> None:
    assert main(["hello", "world"]) == 7
    assert capsys.readouterr().out == "hello world\n"
