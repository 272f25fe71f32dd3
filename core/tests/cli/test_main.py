"""The ``paged`` entry point: subcommand discovery, exit codes, one-line errors."""

from __future__ import annotations

import sys

import pytest

import paged_core
import paged_core.cli as cli_package
from paged_core.api import PLUGIN_API_VERSION
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
    assert f"paged-core {paged_core.__version__} (plugin API {PLUGIN_API_VERSION}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "extra"), [(["generate"], "models"), (["serve"], "serve"), (["bench", "throughput"], "bench")]
)
def test_a_missing_extra_is_a_one_line_hint(monkeypatch, capsys, argv, extra) -> None:
    from paged_core import extras

    asked: list[str] = []

    def missing(name: str) -> list[str]:
        asked.append(name)
        return ["transformers", "msgspec"]

    monkeypatch.setattr(extras, "missing_for", missing)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert asked == [extra]
    assert err == (
        f"paged {argv[0]} needs paged-core[{extra}] (missing: transformers, msgspec); "
        f"install it with: pip install 'paged-core[{extra}]'\n"
    )


@pytest.fixture
def generate_raising(monkeypatch):
    """``paged generate`` whose ``run`` raises the given import error (the metadata check passing)."""

    def install(exc: ImportError) -> None:
        def run(args: object) -> int:
            raise exc

        run.__module__ = "paged_core.cli.generate"  # the module whose EXTRA applies
        parser = build_parser()
        args = parser.parse_args(["generate"])
        args.func = run
        monkeypatch.setattr("paged_core.extras.missing_for", lambda name: [])
        monkeypatch.setattr(parser, "parse_args", lambda argv: args)
        monkeypatch.setattr("paged_core.cli.main.build_parser", lambda: parser)

    return install


def test_an_import_error_the_metadata_missed_becomes_the_hint(generate_raising, capsys) -> None:
    generate_raising(ModuleNotFoundError("No module named 'gguf'", name="gguf"))
    assert main(["generate"]) == 1
    assert capsys.readouterr().err.strip() == (
        "paged generate needs paged-core[models] (missing: gguf); install it with: pip install 'paged-core[models]'"
    )


def test_paged_cores_own_import_errors_stay_tracebacks(generate_raising) -> None:
    generate_raising(ModuleNotFoundError("No module named 'paged_core.nowhere'", name="paged_core.nowhere"))
    with pytest.raises(ModuleNotFoundError):
        main(["generate"])


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


def test_a_parser_needing_a_missing_module_becomes_a_stand_in(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "needy.py").write_text(
        "EXTRA = 'serve'\ndef register(subparsers):\n    import paged_test_not_installed_anywhere\n"
    )
    monkeypatch.setattr(cli_package, "__path__", [*cli_package.__path__, str(tmp_path)])
    monkeypatch.setattr("paged_core.extras.missing_for", lambda name: [])
    try:
        assert "needs paged-core[serve]" in build_parser().format_help()
        assert main(["needy", "--any", "args"]) == 1
    finally:
        sys.modules.pop("paged_core.cli.needy", None)
    assert capsys.readouterr().err.strip() == (
        "paged needy needs paged-core[serve] (missing: paged_test_not_installed_anywhere); "
        "install it with: pip install 'paged-core[serve]'"
    )


def test_adding_a_subcommand_is_one_file(extra_subcommand, capsys) -> None:
    assert main(["hello", "world"]) == 7
    assert capsys.readouterr().out == "hello world\n"


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path) -> None:
    """`paged backends | grep -q x` closes the pipe after the first match; the rest must not be a traceback."""
    import subprocess

    # The plain table (a core-only install has no rich), made long enough to outlast the reader.
    program = tmp_path / "paged_plain.py"
    program.write_text(
        "import sys\n"
        "sys.modules['rich.console'] = None\n"
        "import paged_core.cli.backends as b\n"
        "b.render_plain = lambda records: 'x\\n' * 200000\n"
        "from paged_core.cli.main import main\n"
        "sys.exit(main(['backends']))\n"
    )
    script = f"{sys.executable} {program} | head -c 1 > /dev/null; echo ${{PIPESTATUS[0]}}"
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stdout.strip() in ("0", "141"), run.stdout  # 0 if it finished writing before the reader left
