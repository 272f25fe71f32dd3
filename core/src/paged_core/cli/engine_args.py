"""Engine and sampling options shared by ``paged generate``, ``paged chat`` (and later ``serve``/``bench``)."""

from __future__ import annotations

import argparse
from typing import Any

from paged_core.engine.config import DTYPES, GRAPH_MODES, MODEL_IMPLS, EngineConfig
from paged_core.errors import ConfigError
from paged_core.sampling.params import SamplingParams


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--backend``, ``--dtype``, the KV budget and the scheduler's limits."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="local model directory or .gguf file (default: embedded SmolLM2)")
    g.add_argument("--backend", default=None, help="backend name (default: best available; see `paged backends`)")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help="compute dtype (auto: bf16 where fast, else fp32)")
    g.add_argument("--kv-cache-memory", default=None, help="KV-cache budget, e.g. 4GiB (default: from free memory)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of one step")
    g.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output (default: the model's)")
    g.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default: the backend's)")
    g.add_argument("--no-prefix-caching", action="store_true", help="turn off the prefix cache")
    g.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one step")
    g.add_argument("--model-impl", default="auto", choices=MODEL_IMPLS,
                   help="fused: the engine's decoder (Llama/Mistral/Qwen2/Qwen3); transformers: its modules; "
                   "auto: fused where it applies")  # fmt: skip
    g.add_argument("--graph-mode", default="auto", choices=GRAPH_MODES,
                   help="eager, compiled (torch.compile), device (CUDA/HIP/XPU graphs); auto: device graphs where "
                   "the backend captures, else eager")  # fmt: skip
    g.add_argument("--enforce-eager", action="store_true", help="same as --graph-mode eager")
    g.add_argument("--capture-sizes", default=None,
                   help="comma-separated batch sizes that get a device graph (default 1,2,4,8,16,...)")  # fmt: skip
    g.add_argument("--compile-cache-dir", default=None, help="compiled-step cache (default ~/.cache/paged/compile)")


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int = 256) -> None:
    """The sampling options, named as in the OpenAI API and vLLM."""
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default {max_tokens})")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None, help="per-request seed (reproducible sampling)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--n", type=int, default=1, help="completions per prompt")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")


def engine_config_from(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """An :class:`EngineConfig` from parsed engine options."""
    return EngineConfig(
        model=args.model,
        backend=args.backend,
        dtype=args.dtype,
        kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        enable_prefix_caching=not args.no_prefix_caching,
        enable_chunked_prefill=not args.no_chunked_prefill,
        model_impl=args.model_impl,
        graph_mode="eager" if args.enforce_eager else args.graph_mode,
        capture_sizes=_sizes(args.capture_sizes),
        compile_cache_dir=args.compile_cache_dir,
        **overrides,
    )


def _sizes(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--capture-sizes must be comma-separated ints, got {text!r}") from None


def sampling_params_from(args: argparse.Namespace) -> SamplingParams:
    """A :class:`SamplingParams` from parsed sampling options (validated: errors name the option)."""
    return SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        seed=args.seed,
        stop=args.stop,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
    )
