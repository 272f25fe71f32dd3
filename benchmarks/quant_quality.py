"""Packed weights against the dequantized model: NLL of a fixed text, and greedy agreement on the e2e prompts.

    python benchmarks/quant_quality.py [--model FILE.gguf] [--backend cpu] [--max-tokens 32] [--json out.json]

Ours: the engine on the GGUF with its blocks packed (``--quantization auto``). The dequantized
model: transformers' own ``from_pretrained(gguf_file=...)`` in fp32 (its dequantizing path),
run with its own attention. NLL is per predicted token of the repository's LICENSE (~2,200
tokens, scored by :mod:`paged_bench.nll`), once in chunks of 256 tokens (the many-row kernels)
and once one token per forward as decoding runs (the streaming kernels); greedy agreement runs the 32 mixed prompts of
``tests/e2e`` (``mixed_prompts``) through both and counts prompts whose whole continuation
matches, and tokens matching before the first difference, once batched (32 rows per step: the
many-row kernels for most steps) and once one prompt at a time (one row per step: the streaming
kernels, with the cpu backend's int8 activations by default).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from paged_bench.nll import engine_nll, transformers_nll
    from paged_core import LLM, SamplingParams

    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from e2e_helpers import mixed_prompts  # the e2e battery's prompts, as the tests cut them

    llm = LLM(args.model, backend=args.backend, dtype="float32", kv_cache_memory="512MiB")
    src = llm.engine.loaded.source
    dense = AutoModelForCausalLM.from_pretrained(str(src.directory), gguf_file=src.gguf_file, dtype=torch.float32)
    dense = dense.eval()
    ids = llm.tokenizer.encode((ROOT / "LICENSE").read_text())
    t0 = time.perf_counter()
    ours = engine_nll(llm, ids)
    # One token per forward, as decoding runs: the streaming kernels (on the cpu backend, int8 activations
    # unless PAGED_CPU_LINEAR_ACTIVATIONS=fp32) instead of the many-row path the chunks above take.
    ours_rows = engine_nll(llm, ids, chunk=1)
    theirs = transformers_nll(dense, ids)
    nll_s = time.perf_counter() - t0

    prompts = mixed_prompts(llm.tokenizer, args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    # One prompt at a time: every decode step is one row, the streaming kernels' case (the batch above runs
    # its 32 rows through the many-row path for most steps).
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    ref = []
    with torch.inference_mode():
        for p in prompts:
            x = torch.tensor([p])
            y = dense.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=args.max_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            ref.append(y[0, len(p) :].tolist())
    same = sum(a == b for a, b in zip(outs, ref, strict=True))
    same_alone = sum(a == b for a, b in zip(alone, ref, strict=True))
    prefix = [_agree(a, b) for a, b in zip(outs, ref, strict=True)]
    result = {
        "model": src.name,
        "backend": llm.engine.loaded.backend.name,
        "tokens": len(ids),
        "nll_packed": ours,
        "nll_dequantized_fp32": theirs,
        "nll_relative_difference": (ours - theirs) / theirs,
        "nll_packed_one_token_per_step": ours_rows,
        "nll_one_token_relative_difference": (ours_rows - theirs) / theirs,
        "linear_activations": _linear_activations(),
        "greedy_prompts": len(prompts),
        "greedy_max_tokens": args.max_tokens,
        "greedy_identical": same,
        "greedy_agreement_rate": same / len(prompts),
        "greedy_tokens_before_first_difference": sum(prefix) / (len(prompts) * args.max_tokens),
        "divergent_prompts": [i for i, (a, b) in enumerate(zip(outs, ref, strict=True)) if a != b],
        "greedy_identical_one_at_a_time": same_alone,
        "greedy_tokens_before_first_difference_one_at_a_time": sum(
            _agree(a, b) for a, b in zip(alone, ref, strict=True)
        )
        / (len(prompts) * args.max_tokens),
        "divergent_prompts_one_at_a_time": [i for i, (a, b) in enumerate(zip(alone, ref, strict=True)) if a != b],
        "nll_seconds": nll_s,
    }
    for k, v in result.items():
        print(f"{k:40s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


def _agree(a: list[int], b: list[int]) -> int:
    """Tokens before the first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def _linear_activations() -> str | None:
    """The cpu backend's activation mode for packed linears (``None`` where it is not installed)."""
    try:
        from paged_backend_cpu import ops
    except ImportError:
        return None
    return f"{ops.linear_activations()} ({ops.quant_q8_isa()})"


if __name__ == "__main__":
    main()
