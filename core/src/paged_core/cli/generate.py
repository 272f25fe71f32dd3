"""``paged generate "PROMPT" ...``: complete prompts with the embedded model (or ``--model``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from paged_core.cli.engine_args import add_engine_args, add_sampling_args, engine_config_from, sampling_params_from
from paged_core.process.logs import setup_logging

EXTRA = "models"
"""The optional part of paged-core this subcommand needs (``paged-core[models]``)."""


def register(subparsers: Any) -> None:
    """Add the ``generate`` subcommand."""
    parser = subparsers.add_parser(
        "generate",
        help="complete prompts (default model: embedded SmolLM2)",
        description="Complete each PROMPT. Prompts go through the chat template unless --raw is given.",
    )
    parser.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text (default: read one from stdin)")
    parser.add_argument("--raw", action="store_true", help="send prompts as plain text, without the chat template")
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine set-up and per-request metrics")
    add_engine_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the engine, run the prompts as one batch, print the completions."""
    from paged_core.frontend.llm import LLM

    setup_logging(args.verbose)
    params = sampling_params_from(args)
    prompts = args.prompts or [sys.stdin.read().strip()]
    llm = LLM(**engine_config_from(args).to_flat())
    use_chat = not args.raw and llm.tokenizer is not None and getattr(llm.tokenizer, "chat_template", None)
    if use_chat:
        batch: list[Any] = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    else:
        batch = list(prompts)
    try:
        outputs = llm.generate(batch, params, use_tqdm=len(batch) > 1)
    finally:
        llm.close()  # tensor-parallel workers and a core process stop now, not at interpreter exit
    status = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        if args.json:
            record = out.to_dict()
            record["prompt"] = prompt
            print(json.dumps(record))
            continue
        if out.error:
            print(f"error: {out.error}", file=sys.stderr)
            status = 1
            continue
        if len(prompts) > 1:
            print(f"### {prompt}")
        for completion in out.outputs:
            if len(out.outputs) > 1:
                print(f"--- completion {completion.index}")
            print(completion.text)
        m = out.metrics
        if args.verbose and m.time_to_first_token is not None and m.latency:
            rate = m.num_generated_tokens / m.latency
            print(
                f"[{m.num_prompt_tokens} prompt tokens ({m.num_cached_tokens} cached), {m.num_generated_tokens} "
                f"generated, TTFT {m.time_to_first_token * 1e3:.0f} ms, {rate:.1f} tok/s]",
                file=sys.stderr,
            )
    return status
