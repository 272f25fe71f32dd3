"""``paged bench serve``'s server side without a server: option parsing, command lines, stopping a process group."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import pytest

from paged_bench.serve_bench import ServeBenchOptions
from paged_bench.serve_run import IN_PROCESS_FLAG, engine_argv, parse_urls, parse_variants, stop, variant_command
from paged_core.cli.engine_args import add_engine_args


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return parser.parse_args(list(argv))


def test_engine_argv_passes_only_what_differs_from_the_defaults() -> None:
    assert engine_argv(parsed()) == []
    flags = engine_argv(
        parsed(
            "--kv-cache-memory",
            "1GiB",
            "--max-num-seqs",
            "64",
            "--no-prefix-caching",
            "--enforce-eager",
            "--backend",
            "cpu",
        )
    )
    pairs = " ".join(flags)  # order follows the config's sections; each value follows its flag
    for part in (
        "--backend cpu",
        "--kv-cache-memory 1GiB",
        "--max-num-seqs 64",
        "--no-prefix-caching",
        "--enforce-eager",
    ):
        assert part in pairs
    assert len(flags) == 8
    # Round trip: the flags parse back to the same engine options.
    assert vars(parsed(*flags)) == vars(
        parsed(
            "--kv-cache-memory",
            "1GiB",
            "--max-num-seqs",
            "64",
            "--no-prefix-caching",
            "--enforce-eager",
            "--backend",
            "cpu",
        )
    )


def test_parse_variants_and_urls() -> None:
    assert parse_variants("inproc, mp,inproc") == ("inproc", "mp")
    with pytest.raises(ValueError, match="--servers"):
        parse_variants("mp,threads")
    assert parse_urls("http://h:1/") == [("url", "http://h:1")]
    assert parse_urls("a=http://h:1,b=https://h:2") == [("a", "http://h:1"), ("b", "https://h:2")]
    with pytest.raises(ValueError, match="http"):
        parse_urls("h:1")
    with pytest.raises(ValueError, match="differ"):
        parse_urls("a=http://h:1,a=http://h:2")


def test_variant_commands() -> None:
    mp, notes = variant_command("mp", 1234, ["--kv-cache-memory", "1GiB"], ["--max-n", "2"])
    assert mp[:4] == [sys.executable, "-m", "paged_core.cli.main", "serve"] and notes == []
    assert mp[mp.index("--port") + 1] == "1234" and mp[-4:] == ["--kv-cache-memory", "1GiB", "--max-n", "2"]
    with_flag, notes = variant_command("inproc", 1, [], in_process_flag=True)
    assert with_flag[-1] == IN_PROCESS_FLAG and notes == []
    without, notes = variant_command("inproc", 1, [], in_process_flag=False)
    assert IN_PROCESS_FLAG not in without and IN_PROCESS_FLAG in notes[0]
    with pytest.raises(ValueError, match="variant"):
        variant_command("threads", 1, [])


def test_compare_async_runs_each_variant_in_turn_then_overlapped() -> None:
    assert parse_variants("mp,inproc", compare_async=True) == ("mp+sync", "mp+async", "inproc+sync", "inproc+async")
    assert parse_variants("mp+async,inproc") == ("mp+async", "inproc")
    with pytest.raises(ValueError, match="--servers"):
        parse_variants("mp+fast")
    sync, _ = variant_command("mp+sync", 1, ["--async-scheduling"])
    overlapped, _ = variant_command("inproc+async", 1, [], in_process_flag=True)
    assert sync[-1] == "--no-async-scheduling"  # the suffix wins over the engine options given to every server
    assert overlapped[-2:] == ["--async-scheduling", IN_PROCESS_FLAG]
    # The switch is passed on to started servers as given, either way, and parses back.
    assert engine_argv(parsed("--async-scheduling")) == ["--async-scheduling"]
    assert engine_argv(parsed("--no-async-scheduling")) == ["--no-async-scheduling"]
    assert parsed(*engine_argv(parsed("--no-async-scheduling"))).async_scheduling is False


def test_serve_workload_is_checked() -> None:
    opts = ServeBenchOptions(servers=("mp+sync", "mp+async"), workload="decode-1")
    assert len(opts.requests()) == 1 and len(opts.warmup(1)) == 1
    with pytest.raises(ValueError, match="unknown workload 'decode'"):
        ServeBenchOptions(workload="decode")


def test_stop_ends_the_whole_group_even_a_child_that_ignores_sigterm() -> None:
    # The leader starts a child that ignores SIGTERM (like a busy engine-core process), prints its pid, waits.
    script = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
        "print(c.pid, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    t0 = time.monotonic()
    stop(proc, grace=0.5)
    assert proc.returncode is not None and time.monotonic() - t0 < 10
    for _ in range(100):  # SIGKILL is asynchronous: give the child a moment to die
        if not alive(child):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"child {child} survived stop()")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
