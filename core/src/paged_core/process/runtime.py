"""The process runtime of the heavy subcommands: tcmalloc (and, on request, Intel OpenMP), preloaded by a re-exec.

vLLM's CPU guide has users preload tcmalloc (in place of glibc's allocator) and Intel OpenMP
(``libiomp5.so``, which also exports the ``GOMP_*`` entry points that torch's CPU build calls).
Both only take effect when loaded before anything else, that is through ``LD_PRELOAD`` at process
start. Rather than asking users to set it, :func:`maybe_reexec` re-executes the current process
once, same interpreter, same arguments, same open file descriptors and pid (``os.execve``), with
the libraries that it found prepended to ``LD_PRELOAD``. No OpenMP variables are set (vLLM's
``KMP_BLOCKTIME``/``KMP_AFFINITY`` showed no gain here); those that the user sets pass through.

By default only the allocator is preloaded. Intel OpenMP is opt-in (``PAGED_RUNTIME=iomp``): on
the machines measured, torch's own GNU OpenMP with the cpu backend's many short parallel regions
ran faster everywhere (an AVX-512 Zen machine, 64 ``throughput`` requests: 292 against 181 output
tok/s dense, 163 against 116 packed; ``decode-1`` packed 108 against 57 tok/s; README, Performance).

The re-exec costs one more interpreter start: as long as importing :mod:`paged_core` imports torch,
that is one more ``import torch`` (about 1.7 s on a 2-core machine) before the command runs.

Rules, in the order they are checked (see :func:`plan`):

* ``PAGED_RUNTIME=0`` (or ``false``/``no``/``off``) turns it off; ``PAGED_RUNTIME=iomp`` adds
  Intel OpenMP to the allocator; any other value (or none) is the default, the allocator alone;
* only ``generate``, ``chat``, ``serve`` and ``bench`` get it; ``--help``/``--version`` never do;
* a process started by the re-exec carries :data:`ENV_MARKER` and never re-executes again, even
  when the loader ignored a library (so it cannot loop);
* a library that is missing, or already mapped into the process (the user's own
  ``LD_PRELOAD``), is left out; with nothing left to add there is no re-exec. An allocator that
  the user preloads (jemalloc, mimalloc, another tcmalloc) wins over ours.

Nothing here may break the command: any failure leaves the process running as it is, with a
debug-level log line. The re-executed process takes its additions back out of ``LD_PRELOAD`` (see
:func:`adopt`), so that programs it starts get the user's environment, not our libraries.

This module uses the standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

ENV_SWITCH = "PAGED_RUNTIME"
"""Set to 0/false/no/off to run every subcommand with the plain glibc allocator; to ``iomp`` to add Intel OpenMP."""

ENV_MARKER = "PAGED_RUNTIME_REEXEC"
"""Set by the re-exec, for the re-executed process only: a JSON list of the paths it prepended."""

HEAVY_COMMANDS = frozenset({"generate", "chat", "serve", "bench"})
ALLOCATOR_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
OPENMP_NAMES = ("libiomp5.so",)
# Mapped objects whose name starts with one of these count as "an allocator is already loaded".
_ALLOCATOR_PREFIXES = ("libtcmalloc", "libjemalloc", "libmimalloc")
_OPENMP_PREFIXES = ("libiomp5",)
_FALSE = frozenset({"0", "false", "no", "off"})
_WITH_OPENMP = frozenset({"iomp", "openmp", "intel-openmp"})


def library_dirs(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where to look, in order: this environment's lib/, conda's, LD_LIBRARY_PATH, the linker's usual dirs."""
    env = os.environ if environ is None else environ
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    dirs = [os.path.join(sys.prefix, "lib")]
    if env.get("CONDA_PREFIX"):
        dirs.append(os.path.join(env["CONDA_PREFIX"], "lib"))
    dirs += [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [
        "/usr/local/lib",
        f"/usr/lib/{multiarch}",
        f"/lib/{multiarch}",
        "/usr/lib64",
        "/lib64",
        "/usr/lib",
        "/lib",
    ]
    return list(dict.fromkeys(dirs))


def find_library(names: Sequence[str], dirs: Iterable[str]) -> str | None:
    """The first of ``names`` (in preference order) that is a file in one of ``dirs``; None if none is."""
    dirs = list(dirs)
    for name in names:
        for d in dirs:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
    return None


def mapped_objects(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of the shared objects mapped into this process (empty where /proc is not readable)."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5] not in paths:
            paths.append(parts[5])
    return paths


def _loaded(prefixes: Sequence[str], objects: Iterable[str]) -> str | None:
    for path in objects:
        if os.path.basename(path).startswith(tuple(prefixes)):
            return path
    return None


def _preload_entries(value: str) -> list[str]:
    # ld.so splits LD_PRELOAD on spaces and colons.
    return [e for e in value.replace(" ", ":").split(":") if e]


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand of a ``paged`` argument list: its first word that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


@dataclass(frozen=True)
class Plan:
    """What :func:`maybe_reexec` would do: ``env`` is None when it leaves the process as it is."""

    reason: str
    allocator: str | None = None
    openmp: str | None = None
    preload: tuple[str, ...] = ()
    env: dict[str, str] | None = field(default=None, repr=False)


def plan(
    argv: Sequence[str],
    environ: Mapping[str, str],
    dirs: Sequence[str] | None = None,
    loaded: Iterable[str] = (),
) -> Plan:
    """Decide on the re-exec for ``paged`` arguments ``argv`` (no program name), without doing it.

    ``loaded`` are the paths of the objects already mapped into the process.
    """
    switch = environ.get(ENV_SWITCH)
    if switch is not None and switch.strip().lower() in _FALSE:
        return Plan(f"off ({ENV_SWITCH}={switch})")
    if ENV_MARKER in environ:
        return Plan("already re-executed")
    if not sys.platform.startswith("linux"):
        return Plan(f"not on Linux ({sys.platform})")
    command = _command(argv)
    if command not in HEAVY_COMMANDS:
        return Plan(f"not a heavy subcommand ({command})")
    if any(a in ("-h", "--help", "--version") for a in argv):
        return Plan("help or version only")
    if not sys.executable:
        return Plan("no interpreter path to re-execute")
    dirs = library_dirs(environ) if dirs is None else list(dirs)
    loaded = list(loaded)
    allocator = find_library(ALLOCATOR_NAMES, dirs)
    wants_openmp = switch is not None and switch.strip().lower() in _WITH_OPENMP
    openmp = find_library(OPENMP_NAMES, dirs) if wants_openmp else None
    preload = []
    if allocator is not None and _loaded(_ALLOCATOR_PREFIXES, loaded) is None:
        preload.append(allocator)
    if openmp is not None and _loaded(_OPENMP_PREFIXES, loaded) is None:
        preload.append(openmp)
    if not preload:
        reason = "nothing found" if allocator is None and openmp is None else "nothing left to preload"
        return Plan(reason, allocator, openmp)
    env = dict(environ)
    env["LD_PRELOAD"] = ":".join([*preload, *_preload_entries(environ.get("LD_PRELOAD", ""))])
    env[ENV_MARKER] = json.dumps(preload)
    return Plan("re-exec", allocator, openmp, tuple(preload), env)


def exec_argv(argv: Sequence[str]) -> list[str] | None:
    """The command line that starts this process again with ``paged`` arguments ``argv``; None if none can.

    ``sys.orig_argv`` keeps the interpreter's own options and how the CLI was reached (the
    console script, ``-m paged_core.cli.main``, ``-c``); when it does not end with ``argv``
    (an embedding program), the module form is used. A program that Python read from standard
    input cannot be read again.
    """
    if sys.argv[:1] in (["-"], [""]):
        return None
    orig = list(getattr(sys, "orig_argv", []))
    if len(orig) > len(argv) and orig[len(orig) - len(argv) :] == list(argv):
        return [sys.executable, *orig[1:]]
    return [sys.executable, "-m", "paged_core.cli.main", *argv]


@dataclass
class _State:
    """This process's record, for :func:`runtime_status`."""

    reexecuted: bool = False
    reason: str = "not checked"
    preloaded: list[str] = field(default_factory=list)


_state = _State()


def maybe_reexec(argv: Sequence[str] | None = None) -> None:
    """Re-execute this process with the runtime preloaded when :func:`plan` says so; else return.

    ``argv`` are the ``paged`` arguments (default ``sys.argv[1:]``). Returns only when there is
    nothing to do or the exec failed; never raises.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if adopt():
            return
        decided = plan(args, os.environ, loaded=mapped_objects())
        _state.reason = decided.reason
        logger.debug(
            "runtime: %s (allocator %s, openmp %s)",
            decided.reason,
            decided.allocator or "not found",
            decided.openmp or "not found",
        )
        if decided.env is None:
            return
        target = exec_argv(args)
        if target is None:
            _state.reason = "the program was read from standard input"
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os.execve(sys.executable, target, decided.env)
    except Exception as exc:  # exec failed (or anything odd): run as is
        _state.reason = f"re-exec failed: {exc}"
        logger.debug("runtime: re-exec failed, running as is: %s", exc)


def adopt() -> bool:
    """In a process started by the re-exec: note it, take our entries back out of the environment, return True.

    ``LD_PRELOAD`` is read by the loader only at exec, so restoring the user's value changes nothing
    here; it keeps programs started from this process (compilers, another venv's Python with its
    own libiomp5) free of our libraries. A ``paged`` started from here decides afresh.
    """
    raw = os.environ.pop(ENV_MARKER, None)
    if raw is None:
        return False
    _state.reexecuted = True
    _state.reason = "re-executed"
    try:
        added = [str(p) for p in json.loads(raw)]
    except (ValueError, TypeError):
        return True
    _state.preloaded = added
    entries = _preload_entries(os.environ.get("LD_PRELOAD", ""))
    if entries[: len(added)] == added:
        rest = entries[len(added) :]
        if rest:
            os.environ["LD_PRELOAD"] = ":".join(rest)
        else:
            os.environ.pop("LD_PRELOAD", None)
    return True


def child_environ() -> dict[str, str]:
    """The environment for a helper process that must run like this one (the engine core of ``paged serve``).

    It gets this process's own additions preloaded again and :data:`ENV_MARKER`, so it calls
    :func:`adopt` and its own children are again free of our libraries.
    """
    env = dict(os.environ)
    added = list(_state.preloaded)
    if added:
        env["LD_PRELOAD"] = ":".join(added + _preload_entries(env.get("LD_PRELOAD", "")))
        env[ENV_MARKER] = json.dumps(added)
    return env


def runtime_status() -> dict[str, object]:
    """What is in effect in this process, for reports and ``-v`` logs.

    ``allocator``/``openmp``: the path of the tcmalloc (or other preloaded allocator) and Intel
    OpenMP objects mapped into the process, or None (whoever preloaded them); ``reexecuted``:
    whether this process was started by :func:`maybe_reexec`, and ``preloaded`` the paths that it
    added to ``LD_PRELOAD``; ``reason``: what the last decision was; ``switch``: the value of
    ``PAGED_RUNTIME`` (None when unset).
    """
    objects = mapped_objects()
    return {
        "allocator": _loaded(_ALLOCATOR_PREFIXES, objects),
        "openmp": _loaded(_OPENMP_PREFIXES, objects),
        "reexecuted": _state.reexecuted,
        "preloaded": list(_state.preloaded),
        "reason": _state.reason,
        "switch": os.environ.get(ENV_SWITCH),
    }
