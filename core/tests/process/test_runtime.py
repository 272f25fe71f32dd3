"""The runtime re-exec of the heavy subcommands: library discovery, the planned environment, the switch, no loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paged_core.cli import main as main_module
from paged_core.process import runtime
from paged_core.process.runtime import (
    ALLOCATOR_NAMES,
    ENV_MARKER,
    ENV_SWITCH,
    OPENMP_NAMES,
    find_library,
    library_dirs,
    plan,
)


@pytest.fixture(autouse=True)
def _runtime_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No switch or marker from the developer's shell, and a fresh record of the last decision."""
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    monkeypatch.delenv(ENV_MARKER, raising=False)
    monkeypatch.setattr(runtime, "_state", runtime._State())


@pytest.fixture
def libs(tmp_path: Path) -> dict[str, Path]:
    """A fake layout: the allocator in a system-like dir, Intel OpenMP in an environment's lib/."""
    system, env_lib, empty = tmp_path / "usr-lib", tmp_path / "venv-lib", tmp_path / "empty"
    for d in (system, env_lib, empty):
        d.mkdir()
    (system / "libtcmalloc_minimal.so.4").write_bytes(b"")
    (env_lib / "libiomp5.so").write_bytes(b"")
    return {"system": system, "env": env_lib, "empty": empty}


def _dirs(libs: dict[str, Path]) -> list[str]:
    return [str(libs["empty"]), str(libs["env"]), str(libs["system"])]


# --- discovery --------------------------------------------------------------------------------------------------


def test_finds_each_library_in_whichever_dir_holds_it(libs) -> None:
    dirs = _dirs(libs)
    assert find_library(ALLOCATOR_NAMES, dirs) == str(libs["system"] / "libtcmalloc_minimal.so.4")
    assert find_library(OPENMP_NAMES, dirs) == str(libs["env"] / "libiomp5.so")
    assert find_library(OPENMP_NAMES, [str(libs["empty"]), str(libs["system"])]) is None


def test_the_minimal_allocator_is_preferred_wherever_it_is(libs) -> None:
    (libs["env"] / "libtcmalloc.so.4").write_bytes(b"")  # earlier dir, less wanted name
    assert find_library(ALLOCATOR_NAMES, _dirs(libs)) == str(libs["system"] / "libtcmalloc_minimal.so.4")
    (libs["system"] / "libtcmalloc_minimal.so.4").unlink()
    assert find_library(ALLOCATOR_NAMES, _dirs(libs)) == str(libs["env"] / "libtcmalloc.so.4")


def test_a_directory_named_like_the_library_is_not_it(libs) -> None:
    (libs["empty"] / "libiomp5.so").mkdir()
    assert find_library(OPENMP_NAMES, _dirs(libs)) == str(libs["env"] / "libiomp5.so")


def test_search_dirs_start_with_this_environment_then_conda_then_ld_library_path() -> None:
    dirs = library_dirs({"CONDA_PREFIX": "/opt/conda", "LD_LIBRARY_PATH": "/x/lib::/usr/lib"})
    assert dirs[:3] == [os.path.join(sys.prefix, "lib"), "/opt/conda/lib", "/x/lib"]
    assert "/usr/lib64" in dirs and any(d.startswith("/usr/lib/") and d.endswith("-linux-gnu") for d in dirs)
    assert len(dirs) == len(set(dirs)) and "" not in dirs
    assert dirs.index("/usr/lib") > dirs.index("/x/lib")  # deduplicated at its first place
    assert "/opt/conda/lib" not in library_dirs({})


# --- the plan ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_heavy_subcommands_get_the_allocator_prepended(libs, command) -> None:
    decided = plan([command, "--model", "x"], {"LD_PRELOAD": "/user/libfoo.so", "HOME": "/h"}, _dirs(libs))
    tcmalloc = str(libs["system"] / "libtcmalloc_minimal.so.4")
    assert decided.reason == "re-exec"
    assert decided.preload == (tcmalloc,) and decided.openmp is None  # Intel OpenMP only on request
    assert decided.env is not None
    assert decided.env["LD_PRELOAD"] == f"{tcmalloc}:/user/libfoo.so"
    assert json.loads(decided.env[ENV_MARKER]) == [tcmalloc]
    assert decided.env["HOME"] == "/h"  # the rest of the environment is kept


@pytest.mark.parametrize("value", ["iomp", "OpenMP", " intel-openmp "])
def test_the_switch_asks_for_intel_openmp_beside_the_allocator(libs, value) -> None:
    env = {"LD_PRELOAD": "/user/libfoo.so", "HOME": "/h", ENV_SWITCH: value}
    decided = plan(["serve", "--model", "x"], env, _dirs(libs))
    tcmalloc, iomp = str(libs["system"] / "libtcmalloc_minimal.so.4"), str(libs["env"] / "libiomp5.so")
    assert decided.reason == "re-exec"
    assert decided.preload == (tcmalloc, iomp)
    assert decided.env is not None
    assert decided.env["LD_PRELOAD"] == f"{tcmalloc}:{iomp}:/user/libfoo.so"
    assert json.loads(decided.env[ENV_MARKER]) == [tcmalloc, iomp]
    assert decided.env["HOME"] == "/h"  # the rest of the environment is kept


def test_no_user_preload_means_only_ours(libs) -> None:
    decided = plan(["bench", "decode-1"], {}, _dirs(libs))
    assert decided.env is not None and decided.env["LD_PRELOAD"].split(":") == list(decided.preload)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["backends"],
        ["backends", "--json"],
        ["--version"],
        ["--help"],
        ["bench", "--help"],
        ["serve", "-h"],
        ["frobnicate"],
    ],
)
def test_light_invocations_are_left_alone(libs, argv) -> None:
    decided = plan(argv, {}, _dirs(libs))
    assert decided.env is None and decided.preload == ()


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_the_switch_turns_it_off(libs, value) -> None:
    decided = plan(["serve"], {ENV_SWITCH: value}, _dirs(libs))
    assert decided.env is None and decided.reason.startswith("off")


@pytest.mark.parametrize("value", ["1", "on", ""])
def test_other_switch_values_leave_it_on(libs, value) -> None:
    assert plan(["serve"], {ENV_SWITCH: value}, _dirs(libs)).env is not None


def test_a_re_executed_process_never_plans_another(libs) -> None:
    first = plan(["generate"], {}, _dirs(libs))
    assert first.env is not None
    again = plan(["generate"], first.env, _dirs(libs), loaded=[])  # even if the loader ignored both
    assert again.env is None and again.reason == "already re-executed"


def test_libraries_already_loaded_are_not_added_again(libs) -> None:
    iomp = str(libs["env"] / "libiomp5.so")
    user_allocator = ["/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"]  # the user's allocator wins
    mine = plan(["chat"], {}, _dirs(libs), loaded=user_allocator)
    assert mine.env is None and mine.reason == "nothing left to preload"
    assert plan(["chat"], {ENV_SWITCH: "iomp"}, _dirs(libs), loaded=user_allocator).preload == (iomp,)
    both = [*user_allocator, "/opt/intel/lib/libiomp5.so"]
    decided = plan(["chat"], {ENV_SWITCH: "iomp"}, _dirs(libs), loaded=both)
    assert decided.env is None and decided.reason == "nothing left to preload"


def test_missing_libraries_mean_no_re_exec(libs) -> None:
    decided = plan(["bench"], {}, [str(libs["empty"])])
    assert decided.env is None and decided.reason == "nothing found"
    assert plan(["bench"], {}, [str(libs["env"])]).env is None  # Intel OpenMP alone is not the default
    only_iomp = plan(["bench"], {ENV_SWITCH: "iomp"}, [str(libs["env"])])
    assert only_iomp.allocator is None and only_iomp.preload == (str(libs["env"] / "libiomp5.so"),)


# --- the re-exec itself (execve faked) --------------------------------------------------------------------------


def test_exec_argv_reproduces_how_the_cli_was_started(monkeypatch) -> None:
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "dev", "/venv/bin/paged", "bench", "decode-1"])
    assert runtime.exec_argv(["bench", "decode-1"]) == [
        sys.executable,
        "-X",
        "dev",
        "/venv/bin/paged",
        "bench",
        "decode-1",
    ]
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "pytest", "-q"])  # embedded: the module form
    assert runtime.exec_argv(["serve"]) == [sys.executable, "-m", "paged_core.cli.main", "serve"]


@pytest.mark.parametrize("program", ["-", ""])
def test_a_program_read_from_stdin_is_not_re_executed(monkeypatch, program) -> None:
    monkeypatch.setattr(sys, "argv", [program, "bench"])
    assert runtime.exec_argv(["bench"]) is None


@pytest.fixture
def fake_exec(monkeypatch, libs) -> list[tuple[str, list[str], dict[str, str]]]:
    """Record execve calls instead of making them; the fake layout is what the process finds."""
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(runtime, "library_dirs", lambda environ=None: _dirs(libs))
    monkeypatch.setattr(runtime, "mapped_objects", lambda maps_path="/proc/self/maps": [])
    monkeypatch.setattr(os, "execve", lambda path, args, env: calls.append((path, list(args), dict(env))))
    return calls


def test_maybe_reexec_execs_the_interpreter_with_the_planned_env(fake_exec, monkeypatch) -> None:
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "/venv/bin/paged", "generate", "hi"])
    runtime.maybe_reexec(["generate", "hi"])
    [(path, args, env)] = fake_exec
    assert path == sys.executable and args == [sys.executable, "/venv/bin/paged", "generate", "hi"]
    assert env["LD_PRELOAD"].endswith("libtcmalloc_minimal.so.4") and ENV_MARKER in env


def test_no_exec_when_the_program_cannot_be_read_again(fake_exec, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["-", "bench"])
    runtime.maybe_reexec(["bench"])
    assert fake_exec == [] and runtime.runtime_status()["reason"] == "the program was read from standard input"


def test_a_failed_exec_runs_on_as_is(fake_exec, monkeypatch) -> None:
    def refuse(path: str, args: list[str], env: dict[str, str]) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "execve", refuse)
    runtime.maybe_reexec(["bench"])  # returns instead of raising
    assert runtime.runtime_status()["reason"].startswith("re-exec failed")


def test_the_re_executed_process_takes_its_entries_back_out(fake_exec, monkeypatch, libs) -> None:
    ours = [str(libs["system"] / "libtcmalloc_minimal.so.4"), str(libs["env"] / "libiomp5.so")]
    monkeypatch.setenv(ENV_MARKER, json.dumps(ours))
    monkeypatch.setenv("LD_PRELOAD", ":".join([*ours, "/user/libfoo.so"]))
    runtime.maybe_reexec(["bench"])
    assert fake_exec == []  # no second exec
    assert os.environ["LD_PRELOAD"] == "/user/libfoo.so" and ENV_MARKER not in os.environ
    status = runtime.runtime_status()
    assert status["reexecuted"] is True and status["preloaded"] == ours

    monkeypatch.setenv(ENV_MARKER, json.dumps(ours))
    monkeypatch.setenv("LD_PRELOAD", " ".join(ours))  # ld.so also splits on spaces
    assert runtime.adopt() is True
    assert "LD_PRELOAD" not in os.environ


def test_a_user_preload_that_was_changed_is_left_as_it_is(monkeypatch) -> None:
    monkeypatch.setenv(ENV_MARKER, json.dumps(["/a/libtcmalloc_minimal.so.4"]))
    monkeypatch.setenv("LD_PRELOAD", "/user/libfoo.so")
    assert runtime.adopt() is True
    assert os.environ["LD_PRELOAD"] == "/user/libfoo.so"


def test_main_re_execs_only_when_started_from_the_command_line(monkeypatch, capsys) -> None:
    seen: list[object] = []
    monkeypatch.setattr(runtime, "maybe_reexec", lambda argv=None: seen.append(argv))
    monkeypatch.setattr(sys, "argv", ["paged", "--version"])
    assert main_module.main() == 0
    assert main_module.main(["--version"]) == 0
    assert seen == [None]
    capsys.readouterr()


# --- the real thing: a child process that re-executes itself ---------------------------------------------------

_PROBE = """
import atexit, json, os, sys
started = {"pid": os.getpid(), "marker": os.environ.get("PAGED_RUNTIME_REEXEC"),
           "ld_preload": os.environ.get("LD_PRELOAD")}

def report():
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if "/" in line})
    out = os.environ["PAGED_TEST_PROBE_OUT"]
    with open(out, "a") as f:
        f.write(json.dumps({**started, "mapped": mapped}) + "\\n")

atexit.register(report)
"""


def _found() -> tuple[str | None, str | None]:
    dirs = library_dirs()
    return find_library(ALLOCATOR_NAMES, dirs), find_library(OPENMP_NAMES, dirs)


def _run_probed(tmp_path: Path, cmd: list[str], **env: str) -> tuple[int, int, str, list[dict]]:
    """Run ``cmd`` with a sitecustomize that reports, at exit, the pid, the marker and the mapped objects.

    Returns the pid it was started as, its exit status, its stderr and the reports. Exit handlers do
    not run across an exec, so every report comes from a process that ran to its end.
    """
    tmp_path.mkdir(parents=True, exist_ok=True)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(_PROBE)
    out = tmp_path / "probe.jsonl"
    child_env = {k: v for k, v in os.environ.items() if k not in (ENV_SWITCH, ENV_MARKER, "LD_PRELOAD")}
    python_path = [str(probe_dir), *([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else [])]
    child_env.update(PYTHONPATH=os.pathsep.join(python_path), PAGED_TEST_PROBE_OUT=str(out), **env)
    with subprocess.Popen(
        cmd, env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        _, stderr = proc.communicate(timeout=300)
    reports = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc.pid, proc.returncode, stderr, reports


def _paged_script() -> str | None:
    script = Path(sys.executable).parent / "paged"
    return str(script) if script.is_file() else None


_FAILS_FAST = ["bench", "decode-1", "--output-len", "not-a-number"]  # a heavy subcommand; argparse rejects it


@pytest.mark.slow
@pytest.mark.parametrize(("how", "switch"), [("module", None), ("console script", None), ("module", "iomp")])
def test_the_child_really_runs_with_the_libraries_preloaded(tmp_path, how, switch) -> None:
    allocator, openmp = _found()
    if allocator is None or openmp is None:
        pytest.skip(f"runtime libraries absent (allocator {allocator}, openmp {openmp}); bash ci/setup installs them")
    if how == "module":
        cmd = [sys.executable, "-m", "paged_core.cli.main", *_FAILS_FAST]
    else:
        script = _paged_script()
        if script is None:
            pytest.skip("no paged console script next to this interpreter")
        cmd = [script, *_FAILS_FAST]
    pid, rc, stderr, reports = _run_probed(tmp_path, cmd, **({ENV_SWITCH: switch} if switch else {}))
    assert rc == 2, stderr  # argparse's error in the child: it was given the same arguments
    assert "invalid int value: 'not-a-number'" in stderr
    assert len(reports) == 1, reports  # one process ran to its end
    [child] = reports
    assert child["pid"] == pid  # the process started became the child (execve), not its parent
    assert child["marker"] is not None, "the process that ran to its end was not re-executed"
    added = json.loads(child["marker"])
    assert added == child["ld_preload"].split(":")[: len(added)]
    real = {os.path.realpath(p) for p in child["mapped"]}
    assert os.path.realpath(allocator) in real
    assert (os.path.realpath(openmp) in real) == (switch == "iomp")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "env"), [(_FAILS_FAST, {ENV_SWITCH: "0"}), (["--version"], {})], ids=["switched off", "light command"]
)
def test_no_re_exec_when_switched_off_or_light(tmp_path, argv, env) -> None:
    allocator, openmp = _found()
    if allocator is None and openmp is None:
        pytest.skip("runtime libraries absent here; nothing to preload either way")
    _, rc, stderr, reports = _run_probed(tmp_path, [sys.executable, "-m", "paged_core.cli.main", *argv], **env)
    assert rc in (0, 2), stderr
    [only] = reports
    assert only["marker"] is None
    names = [os.path.basename(p) for p in only["mapped"]]
    assert not any(n.startswith(("libtcmalloc", "libiomp5")) for n in names), names
