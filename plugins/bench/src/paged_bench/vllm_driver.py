"""Run one seeded workload on vLLM's CPU build and write what it measured as JSON.

A standalone script for vLLM's own environment (``benchmarks/vllm_env.sh``):
it imports nothing from paged, and :mod:`paged_bench.vllm_run` runs it
by file path with that environment's python::

    .venv-vllm/bin/python vllm_driver.py REQUESTS.json RESULT.json

``REQUESTS.json``: ``model`` (a safetensors directory), ``requests`` (each
``prompt_token_ids`` and ``max_tokens``), ``engine`` (``dtype``,
``kv_cache_bytes``, ``max_num_seqs``, ``max_num_batched_tokens``,
``enforce_eager``, ``enable_prefix_caching``, ``max_model_len``, ``seed``) and
``warmup`` (bool). Every request is submitted at time 0 as token ids, decoded
greedily with EOS ignored, and vLLM's ``LLMEngine`` is stepped here so each
request's first token can be timed. ``RESULT.json`` holds the figures paged's
``RunResult`` takes, plus the start-up time; the script fails unless every
request produced exactly ``max_tokens`` tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WARMUP = [([100 + i % 997 for i in range(512)], 4), (list(range(200, 232)), 4)]
"""Untimed, like paged's own warm-up: one 512-token prefill and a short decode batch."""

PROGRESS_EVERY_S = 10.0


def log(message: str) -> None:
    print(f"[vllm-driver] {message}", file=sys.stderr, flush=True)


def load_spec(path: str) -> dict[str, Any]:
    """The request file, checked enough that a bad one fails before vLLM starts."""
    spec: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    for key in ("model", "requests", "engine"):
        if key not in spec:
            raise ValueError(f"{path}: missing {key!r}")
    if not spec["requests"]:
        raise ValueError(f"{path}: no requests")
    for i, r in enumerate(spec["requests"]):
        ids, n = r.get("prompt_token_ids"), r.get("max_tokens")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise ValueError(f"{path}: request {i}: prompt_token_ids must be a non-empty list of ints")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{path}: request {i}: max_tokens must be an int >= 1")
    return spec


def build_engine(model: str, settings: dict[str, Any]) -> Any:
    """vLLM's ``LLMEngine`` for token-id prompts (no tokenizer), with paged's settings."""
    from vllm import EngineArgs, LLMEngine

    args = EngineArgs(
        model=model,
        skip_tokenizer_init=True,
        dtype=settings.get("dtype", "bfloat16"),
        kv_cache_memory_bytes=settings.get("kv_cache_bytes"),
        max_num_seqs=settings.get("max_num_seqs", 256),
        max_num_batched_tokens=settings.get("max_num_batched_tokens", 2048),
        enforce_eager=bool(settings.get("enforce_eager", True)),
        enable_prefix_caching=bool(settings.get("enable_prefix_caching", False)),
        max_model_len=settings.get("max_model_len"),
        seed=settings.get("seed", 0),
        disable_log_stats=True,
        **settings.get("extra", {}),
    )
    return LLMEngine.from_engine_args(args)


def sampling_params(max_tokens: int) -> Any:
    """Greedy, EOS ignored, new tokens only in each step's output (no detokenizing)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.DELTA
    )


def run_requests(
    engine: Any,
    requests: Sequence[tuple[list[int], int]],
    params: Any,
    *,
    tag: str = "r",
    clock: Any = time.perf_counter,
    progress: bool = False,
) -> dict[str, Any]:
    """Submit every request at once and step ``engine`` until all finish; the run's figures.

    ``engine`` needs vLLM's ``add_request(id, prompt, params)``, ``step()`` and
    ``has_unfinished_requests()``; ``params`` maps ``max_tokens`` to sampling
    parameters. Each step's outputs carry only new tokens (``DELTA``).
    """
    n = len(requests)
    first: list[float | None] = [None] * n
    produced = [0] * n
    cached = [0] * n
    finished = [False] * n
    emitted: list[tuple[float, int]] = []
    steps = 0
    start = clock()
    index: dict[str, int] = {}
    for i, (ids, max_tokens) in enumerate(requests):
        rid = f"{tag}{i}"
        engine.add_request(rid, {"prompt_token_ids": ids}, params(max_tokens))
        index[rid] = i
    done, last_log = 0, 0.0
    while done < n:
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"vLLM reports no unfinished requests with {n - done} of {n} not finished")
        outs = engine.step()
        now = clock() - start
        new = 0
        for out in outs:
            j = index.get(out.request_id)
            if j is None:
                continue
            k = sum(len(c.token_ids) for c in out.outputs)
            if k and first[j] is None:
                first[j] = now
            produced[j] += k
            new += k
            if out.num_cached_tokens:
                cached[j] = max(cached[j], int(out.num_cached_tokens))
            if out.finished and not finished[j]:
                finished[j] = True
                done += 1
        if new:
            steps += 1
            emitted.append((now, new))
        if progress and now - last_log >= PROGRESS_EVERY_S:
            last_log = now
            log(f"{tag}: {done}/{n} requests finished, {sum(produced)} tokens, {now:.0f} s")
    seconds = clock() - start
    wrong = [(i, produced[i], r[1]) for i, r in enumerate(requests) if produced[i] != r[1]]
    if wrong:
        i, got, want = wrong[0]
        raise RuntimeError(
            f"{len(wrong)} request(s) did not produce exactly max_tokens tokens (request {i}: {got}, asked for {want})"
        )
    ttft = [t for t in first if t is not None]
    return {
        "seconds": seconds,
        "num_requests": n,
        "prompt_tokens": sum(len(ids) for ids, _ in requests),
        "output_tokens": sum(produced),
        "per_request_output_tokens": produced,
        "ttft": ttft if len(ttft) == n else None,
        "decode_tok_s": decode_rate(emitted, max(ttft, default=0.0)),
        "steps": steps,
        "cached_prompt_tokens": sum(cached),
    }


def decode_rate(emitted: Sequence[tuple[float, int]], start: float) -> float | None:
    """Tokens per second produced after ``start`` (when every request had its first token)."""
    after = [(t, k) for t, k in emitted if t > start]
    if not after:
        return None
    span = after[-1][0] - start
    return sum(k for _, k in after) / span if span > 0 else None


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: vllm_driver.py REQUESTS.json RESULT.json", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    spec = load_spec(argv[0])
    settings = spec["engine"]
    kv = settings.get("kv_cache_bytes")
    if kv and kv % 2**30 == 0:  # what vLLM's CPU guide sets; an explicit byte count covers the rest
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv // 2**30))
    import vllm

    engine = build_engine(spec["model"], settings)
    startup = time.perf_counter() - t0
    log(f"vLLM {vllm.__version__} ready in {startup:.1f} s")
    warm = 0.0
    if spec.get("warmup", True):
        t1 = time.perf_counter()
        run_requests(engine, WARMUP, sampling_params, tag="warmup")
        engine.reset_prefix_cache()
        warm = time.perf_counter() - t1
    requests = [(r["prompt_token_ids"], r["max_tokens"]) for r in spec["requests"]]
    result = run_requests(engine, requests, sampling_params, progress=bool(spec.get("progress", True)))
    result.update(
        {
            "startup_s": startup,
            "warmup_s": warm,
            "vllm_version": vllm.__version__,
            "enforce_eager": bool(settings.get("enforce_eager", True)),
            "enable_prefix_caching": bool(settings.get("enable_prefix_caching", False)),
            "env": {
                k: os.environ.get(k) for k in ("LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")
            },
        }
    )
    out = Path(argv[1])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(out)
    log(f"{result['num_requests']} requests, {result['output_tokens']} tokens in {result['seconds']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
