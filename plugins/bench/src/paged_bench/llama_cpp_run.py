"""The optional ``llama.cpp`` baseline of ``decode-1``: llama.cpp's own ``llama-bench`` on the same GGUF file.

llama.cpp is never a dependency of paged: ``benchmarks/llama_cpp_env.sh``
builds its ``llama-bench`` once (from the llama.cpp that the pinned
``llama-cpp-python`` sdist vendors) into a cache folder. Here we run

    llama-bench -m FILE -p 0 -n N -t THREADS -r REPS -o json

where ``N`` is the decode-1 request's ``max_tokens`` and ``THREADS`` the
torch threads our engine ran with, and turn its JSON into a
:class:`LlamaCppRunResult`. ``llama-bench`` times generation alone (a warm-up
run first, then ``REPS`` timed runs of ``N`` tokens from an empty context),
so the run's ``seconds`` is ``N`` over its mean tok/s, ``decode_tok_s`` is
that mean, and its ``prompt_tokens`` are 0 (the request's prompt is not run).
Our run's ``seconds`` also holds its 32-token prompt and first token, so
``decode_tok_s`` is the like-for-like figure; ``paged_vs_llama.cpp`` (output
tok/s) slightly understates ours.

llama.cpp computes on the GGUF's quantized blocks (the embedded SmolLM2 is
Q4_1 with a Q8_0 embedding) where our engine dequantizes them to its dtype, so
it reads far fewer bytes per token: tok/s alone does not say which engine is
closer to the memory bound. The run therefore reports llama.cpp's weight bytes
per token (:func:`weight_bytes_per_token`) and, once the copy bandwidth of the
same benchmark is known (:meth:`LlamaCppRunResult.set_copy_bandwidth`), its own
bandwidth roofline next to ours.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paged_bench.result import RunResult
from paged_bench.workloads import BenchRequest
from paged_core.errors import ConfigError

NAME = "llama.cpp"
WORKLOAD = "decode-1"
"""The only workload this baseline runs: llama-bench times one stream, without our requests' prompts."""
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python sdist whose vendored llama.cpp the setup script builds (its cache subfolder)."""
BENCH_VAR = "PAGED_LLAMA_BENCH"
"""A llama-bench binary to use instead of the setup script's."""
DIR_VAR = "PAGED_LLAMA_CPP_DIR"
DEFAULT_DIR = "~/.cache/paged/llama.cpp"
SETUP = "bash benchmarks/llama_cpp_env.sh"
DEFAULT_REPETITIONS = 3
LOG_TAIL = 40
"""Lines of llama-bench's output quoted when it fails."""
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass
class LlamaCppRunResult(RunResult):
    """A ``llama-bench`` run: what it reported, and the weight bytes llama.cpp reads per generated token."""

    threads: int = 1
    repetitions: int = DEFAULT_REPETITIONS
    stddev_tok_s: float | None = None
    samples_tok_s: list[float] = field(default_factory=list)
    build_commit: str | None = None
    build_number: int | None = None
    model_type: str | None = None
    """llama.cpp's description of the model (``"llama 256M Q4_1"`` for the embedded SmolLM2)."""
    model_size: int | None = None
    """Bytes of the model's tensors as llama-bench counts them."""
    weight_bytes_per_token: int | None = None
    copy: dict[str, Any] | None = None
    """The benchmark's copy-bandwidth measurement (:func:`~paged_bench.machine.measure_copy_bandwidth`)."""

    def set_copy_bandwidth(self, copy: Mapping[str, Any]) -> None:
        """Attach the copy bandwidth measured in the same benchmark, for :meth:`roofline`."""
        self.copy = dict(copy)

    def roofline(self) -> dict[str, Any] | None:
        """llama.cpp's decode tok/s against its own weight bytes per token over the copy bandwidth.

        The same keys as the report's bandwidth roofline (ours), so the two
        ``fraction`` figures compare directly; None until both inputs are known.
        """
        if self.copy is None or not self.weight_bytes_per_token or self.decode_tok_s is None:
            return None
        peak = float(self.copy["bytes_per_s"])
        bound = peak / self.weight_bytes_per_token
        return {
            "kind": "bandwidth",
            "weight_bytes_per_token": self.weight_bytes_per_token,
            "achieved_bytes_per_s": self.decode_tok_s * self.weight_bytes_per_token,
            "peak_bytes_per_s": peak,
            "bound_tok_s": bound,
            "fraction": self.decode_tok_s / bound,
        }

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["roofline"] = self.roofline()
        out["llama_cpp"] = {
            "build_commit": self.build_commit,
            "build_number": self.build_number,
            "model_type": self.model_type,
            "model_size": self.model_size,
            "threads": self.threads,
            "repetitions": self.repetitions,
            "stddev_tok_s": self.stddev_tok_s,
            "samples_tok_s": list(self.samples_tok_s),
        }
        return out


def default_binary(env: Mapping[str, str] | None = None) -> Path:
    """Where the setup script installs llama-bench: ``$PAGED_LLAMA_CPP_DIR/<version>/bin/llama-bench``."""
    env = os.environ if env is None else env
    root = Path(env.get(DIR_VAR) or DEFAULT_DIR).expanduser()
    return root / LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-bench"


def find_llama_bench(env: Mapping[str, str] | None = None) -> Path:
    """``$PAGED_LLAMA_BENCH``, else the setup script's binary; a :class:`ConfigError` naming the script if missing."""
    env = os.environ if env is None else env
    if env.get(BENCH_VAR):
        path = Path(env[BENCH_VAR]).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"{BENCH_VAR}={path} is not an executable file; unset it to use the one `{SETUP}` builds")
        return path
    path = default_binary(env)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ConfigError(
            f"the llama.cpp baseline needs llama.cpp's llama-bench at {path}; build it with "
            f"`{SETUP}` (from the repository root; 10-25 minutes), or set {BENCH_VAR}"
        )
    return path


def resolve_model(model: str | None) -> Path:
    """The GGUF file llama.cpp runs: the embedded one for ``None``, else ``model``, which must be a .gguf file."""
    if model is None:
        from paged_core.loading.loader import embedded_model_path

        return embedded_model_path()
    path = Path(model).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise ConfigError(
            f"the llama.cpp baseline runs a .gguf file (the embedded SmolLM2 by default); this run's model is {model!r}"
        )
    return path.resolve()


def check_ready(model: str | None, workload: str) -> tuple[Path, Path]:
    """Fail now, before a long run of ours, if the llama.cpp baseline could not run; returns (binary, model)."""
    if workload != WORKLOAD:
        raise ConfigError(
            f"the llama.cpp baseline runs only the {WORKLOAD} workload (llama-bench times a "
            f"single stream); this run's workload is {workload!r}"
        )
    model_path = resolve_model(model)
    return find_llama_bench(), model_path


def weight_bytes_per_token(gguf_path: str | Path) -> int:
    """Bytes of weights llama.cpp reads to generate one token of the GGUF model at ``gguf_path``.

    The sum of every tensor's stored size (``n_bytes``: quantized blocks as
    they are in the file, norms in f32) except the token embedding, whose
    lookup reads one row per token (negligible, not counted); when the file
    has no ``output.weight`` the LM head is tied to the embedding and reads
    all of it, so the embedding is then counted once, in full, as the head.
    KV-cache reads and activations are not counted (nor are they in ours). In a MoE file a token reads only its
    ``expert_used_count`` of the ``expert_count`` experts of each 3-D expert tensor (``*_exps``), so those count
    that share of their bytes (the mean over tokens routed evenly, as our roofline counts active experts).
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    share = _active_expert_share(reader)
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    total = sum(
        n * share if ".ffn_" in name and "_exps" in name else n for name, n in tensors.items() if name != EMBEDDING
    )
    total = int(total)
    if OUTPUT not in tensors:
        total += tensors.get(EMBEDDING, 0)
    return total


def _active_expert_share(reader: Any) -> float:
    """``expert_used_count / expert_count`` of a MoE GGUF's architecture, 1 for a dense one."""

    def scalar(key: str) -> int | None:
        field = reader.fields.get(key)
        return None if field is None else int(field.parts[field.data[0]][0])

    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        return 1.0
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    count, used = scalar(f"{arch}.expert_count"), scalar(f"{arch}.expert_used_count")
    return used / count if count and used else 1.0


def bench_command(binary: Path, model: Path, n_gen: int, threads: int, repetitions: int) -> list[str]:
    """``llama-bench`` generating ``n_gen`` tokens with no prompt, ``repetitions`` times, JSON on stdout."""
    return [
        str(binary),
        "-m",
        str(model),
        "-p",
        "0",
        "-n",
        str(n_gen),
        "-t",
        str(threads),
        "-r",
        str(repetitions),
        "-o",
        "json",
    ]


def parse_bench_json(text: str, n_gen: int) -> dict[str, Any]:
    """The test of ``llama-bench -o json``'s output that generated ``n_gen`` tokens with no prompt."""
    start = text.find("[")
    try:
        tests = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as e:
        raise RuntimeError(f"{NAME}: llama-bench's output is not JSON ({e})") from None
    if not isinstance(tests, list):
        raise RuntimeError(f"{NAME}: llama-bench printed no JSON list of tests")
    for t in tests:
        if isinstance(t, dict) and t.get("n_prompt") == 0 and t.get("n_gen") == n_gen:
            ts = t.get("avg_ts")
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not ts > 0:
                raise RuntimeError(f"{NAME}: llama-bench reported no positive avg_ts ({ts!r})")
            return t
    raise RuntimeError(f"{NAME}: llama-bench's output has no test generating {n_gen} tokens without a prompt")


def parse_result(
    data: Mapping[str, Any], request: BenchRequest, threads: int, repetitions: int, weight_bytes: int | None
) -> LlamaCppRunResult:
    """A :class:`LlamaCppRunResult` from one llama-bench test (see :func:`parse_bench_json`)."""
    n = request.max_tokens
    tok_s = float(data["avg_ts"])
    stddev = data.get("stddev_ts")
    samples = data.get("samples_ts")
    build_number = data.get("build_number")
    size = data.get("model_size")
    return LlamaCppRunResult(
        name=NAME,
        seconds=n / tok_s,
        num_requests=1,
        # llama-bench generates from an empty context: the request's prompt is never run, so none is counted.
        prompt_tokens=0,
        output_tokens=n,
        prefill_tokens_computed=0,
        decode_tok_s=tok_s,
        threads=int(data.get("n_threads", threads)),
        repetitions=repetitions,
        stddev_tok_s=float(stddev) if isinstance(stddev, (int, float)) else None,
        samples_tok_s=[float(s) for s in samples] if isinstance(samples, list) else [],
        build_commit=str(data["build_commit"]) if data.get("build_commit") is not None else None,
        build_number=int(build_number) if isinstance(build_number, int) else None,
        model_type=str(data["model_type"]) if data.get("model_type") is not None else None,
        model_size=int(size) if isinstance(size, int) else None,
        weight_bytes_per_token=weight_bytes,
    )


def default_threads() -> int:
    """The threads our engine computed with (torch's intra-op threads in this process)."""
    import torch

    return torch.get_num_threads()


def run_llama_cpp(
    requests: Sequence[BenchRequest],
    model_path: str | Path,
    threads: int | None = None,
    *,
    binary: Path | None = None,
    repetitions: int = DEFAULT_REPETITIONS,
    timeout: float | None = None,
    progress: bool = True,
) -> LlamaCppRunResult:
    """Run the decode-1 request's generation on llama.cpp (``llama-bench``) with ``threads`` threads.

    ``binary`` defaults to :func:`find_llama_bench`, ``threads`` to
    :func:`default_threads`. With ``progress`` llama-bench's log goes to our
    stderr; otherwise it is kept and quoted on failure.
    """
    if len(requests) != 1:
        raise ValueError(f"{NAME}: the {WORKLOAD} workload is one request, got {len(requests)}")
    if not isinstance(repetitions, int) or repetitions < 1:
        raise ValueError(f"repetitions must be an int >= 1, got {repetitions!r}")
    request = requests[0]
    binary = find_llama_bench() if binary is None else binary
    threads = default_threads() if threads is None else threads
    model_path = Path(model_path)
    cmd = bench_command(binary, model_path, request.max_tokens, threads, repetitions)
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=None if progress else subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{NAME}: llama-bench did not finish within {timeout} s") from None
    if proc.returncode != 0:
        lines = ((proc.stderr or "") + (proc.stdout or "")).splitlines()[-LOG_TAIL:]
        tail = "\n" + "\n".join(lines) if lines else ""
        raise RuntimeError(f"{NAME}: llama-bench failed (exit status {proc.returncode}): {' '.join(cmd)}{tail}")
    data = parse_bench_json(proc.stdout, request.max_tokens)
    return parse_result(data, request, threads, repetitions, weight_bytes_per_token(model_path))
