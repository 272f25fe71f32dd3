"""``paged chat``: an interactive conversation that streams tokens as they are generated."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from paged_core.cli.engine_args import add_engine_args, add_sampling_args, engine_config_from, sampling_params_from
from paged_core.process.logs import setup_logging

_HELP = "commands: /reset clears the conversation, /exit (or end of input) quits"


EXTRA = "models"
"""The optional part of paged-core this subcommand needs (``paged-core[models]``)."""


def register(subparsers: Any) -> None:
    """Add the ``chat`` subcommand."""
    parser = subparsers.add_parser(
        "chat",
        help="interactive chat that streams the reply (default model: embedded SmolLM2)",
        description=f"Chat with the model through its chat template. {_HELP}.",
    )
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine set-up")
    add_engine_args(parser)
    add_sampling_args(parser, max_tokens=512)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The read-eval-print loop: each reply streams, then joins the conversation history."""
    from paged_core.frontend.llm import LLM

    setup_logging(args.verbose)
    params = sampling_params_from(args)
    llm = LLM(**engine_config_from(args).to_flat())
    interactive = sys.stdin.isatty()
    history: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    if interactive:
        print(_HELP, file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": text})
        reply = ""
        for out in llm.stream(llm.apply_chat_template(history), params):
            delta = out.outputs[0].new_text
            reply += delta
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": reply})
    return 0
