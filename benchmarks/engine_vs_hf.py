"""Engine tok/s against transformers' own ``generate`` on the same weights and dtype, in one run.

    python benchmarks/engine_vs_hf.py [--backend cpu] [--dtype bfloat16] [--requests 64] [--single-tokens 256]

Two figures, each as a ratio to transformers measured in the same process:
1. one request, ``--single-tokens`` new tokens (a chat prompt, EOS ignored);
2. the first ``--requests`` requests of the ``throughput`` workload (mixed prompt and output lengths),
   transformers running them as static batches of ``--hf-batch`` with left padding.
Output tok/s counts only the tokens each request asked for.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from paged_bench.hf_runs import attention, run_hf_static
from paged_bench.workloads import throughput
from paged_core import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--single-tokens", type=int, default=256)
    ap.add_argument("--kv-cache-memory", default="4GiB")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    llm = LLM(backend=args.backend, dtype=args.dtype, kv_cache_memory=args.kv_cache_memory)
    model = llm.engine.loaded.model
    results: dict[str, object] = {"backend": llm.engine.loaded.backend.name, "dtype": args.dtype}

    prompt = llm.apply_chat_template([{"role": "user", "content": "Tell me a long story about a lighthouse."}])
    single = SamplingParams(temperature=0, max_tokens=args.single_tokens, ignore_eos=True)
    llm.generate([prompt[:8]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    t = time.perf_counter()
    llm.generate([prompt], single, use_tqdm=False)
    ours_single = args.single_tokens / (time.perf_counter() - t)

    x = torch.tensor([prompt])
    with attention(model, "sdpa"), torch.inference_mode():
        model.generate(x[:, :8], max_new_tokens=4, do_sample=False)  # warm-up
        t = time.perf_counter()
        model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=args.single_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    hf_single = args.single_tokens / (time.perf_counter() - t)

    reqs = throughput()[: args.requests]
    total_out = sum(r.max_tokens for r in reqs)
    hf_batch_s = run_hf_static(model, reqs, args.hf_batch, progress=False).seconds
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
    t = time.perf_counter()
    llm.generate([r.prompt_token_ids for r in reqs], params, use_tqdm=False)
    ours_batch_s = time.perf_counter() - t

    results.update(
        single_ours_tok_s=round(ours_single, 1),
        single_hf_tok_s=round(hf_single, 1),
        single_ratio=round(ours_single / hf_single, 2),
        batch_requests=len(reqs),
        batch_output_tokens=total_out,
        batch_ours_tok_s=round(total_out / ours_batch_s, 1),
        batch_hf_static_tok_s=round(total_out / hf_batch_s, 1),
        batch_ratio=round(hf_batch_s / ours_batch_s, 2),
    )
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
