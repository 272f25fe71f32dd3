"""``paged serve [MODEL]``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import os
from typing import Any

from paged_core.cli.engine_args import add_engine_args, engine_config_from
from paged_core.errors import ConfigError
from paged_core.process.logs import setup_logging
from paged_core.serve.lora_modules import RUNTIME_UPDATES_ENV, LoRAModule, parse_lora_module, runtime_updates_from_env

EXTRA = "serve"
"""The optional part of paged-core this subcommand needs (``paged-core[serve]``)."""


def register(subparsers: Any) -> None:
    """Add the ``serve`` subcommand."""
    from paged_core.serve.settings import ServeConfig

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (default: embedded SmolLM2) at /v1/completions, /v1/chat/completions, /v1/models, "
        "/tokenize, /detokenize, /health and /metrics.",
    )
    parser.add_argument(
        "model_path",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="local model directory or .gguf file (same as --model)",
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("PAGED_API_KEY"),
        help="require 'Authorization: Bearer KEY' on API routes (default: $PAGED_API_KEY, else no auth)",
    )
    g.add_argument("--served-model-name", default=None, help="model id clients must send (default: the model's name)")
    g.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    g.add_argument("--max-tokens-limit", type=int, default=None, help="cap on max_tokens (default: context length)")
    g.add_argument("--max-n", type=int, default=16, help="cap on n (default 16)")
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=256,
        help="sequences admitted beyond --max-num-seqs before answering 429 (default 256)",
    )
    g.add_argument(
        "--idle-timeout", type=float, default=5.0, help="seconds a connection may sit idle between requests (default 5)"
    )
    g.add_argument(
        "--header-timeout", type=float, default=10.0, help="seconds a request's headers may take to arrive (default 10)"
    )
    g.add_argument(
        "--body-timeout", type=float, default=30.0, help="seconds a request's body may take to arrive (default 30)"
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=ServeConfig.drain_timeout,
        help="seconds requests in flight get to finish after SIGTERM or Ctrl-C; then each ends with an "
        f"error event (default {ServeConfig.drain_timeout:g})",
    )
    g.add_argument(
        "--allow-special-tokens-in-content",
        action="store_true",
        help="let chat message content contain control-token text such as <|im_start|> (default: refused, "
        "so a user cannot forge a system turn)",
    )
    g.add_argument(
        "--engine-in-process",
        action="store_true",
        help="run the engine core on a thread of the API server's process (default: its own process, so "
        "HTTP, JSON and detokenizing never share a GIL with the model)",
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accept tool_choice 'auto' (the default when a request sends tools): the model's calls are read "
        "from its text by --tool-call-parser",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="how the model writes tool calls: hermes (<tool_call> blocks), llama3_json, or a plugin's parser",
    )
    g.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE_OR_TEXT",
        help="the chat template to use instead of the model's: a file, the template's text, or a bundled one "
        "(chatml-tools: ChatML offering tools, calls read by --tool-call-parser hermes)",
    )
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    lora = parser.add_argument_group("LoRA adapters")
    lora.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        default=[],
        type=_lora_module,
        metavar="NAME=PATH",
        help="serve the PEFT adapter at PATH as the model NAME (also vLLM's JSON form "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\'); loaded and checked at start-up; turns on '
        "--enable-lora",
    )
    lora.add_argument(
        "--enable-lora-runtime-updates",
        action="store_true",
        default=runtime_updates_from_env(),
        help="add POST /v1/load_lora_adapter and /v1/unload_lora_adapter (any client can then make the server "
        f"read an adapter directory); turns on --enable-lora (default: ${RUNTIME_UPDATES_ENV}=True, as vLLM)",
    )
    add_engine_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the engine and serve until interrupted."""
    from paged_core.serve.chat_template import chat_template_text
    from paged_core.serve.server import run_server
    from paged_core.serve.settings import ServeConfig

    setup_logging(args.log_level in ("info", "debug"))
    if args.model_path is not None and args.model is not None and args.model_path != args.model:
        raise ConfigError(f"MODEL {args.model_path!r} and --model {args.model!r} disagree; pass one of them")
    if args.model_path is not None:
        args.model = args.model_path
    config = ServeConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        max_body_bytes=args.max_body_bytes,
        max_tokens_limit=args.max_tokens_limit,
        max_n=args.max_n,
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
        log_level=args.log_level,
        max_queued_requests=args.max_queued_requests,
        idle_timeout=args.idle_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        drain_timeout=args.drain_timeout,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        chat_template=None if args.chat_template is None else chat_template_text(args.chat_template),
        lora_modules=tuple(args.lora_modules),
        enable_lora_runtime_updates=args.enable_lora_runtime_updates,
    )
    return run_server(engine_config_from(args, **lora_overrides(args)), config, in_process=args.engine_in_process)


def lora_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``enable_lora`` turned on when the server is given adapters or may load them at run time."""
    wants = bool(args.lora_modules) or args.enable_lora_runtime_updates
    return {"enable_lora": True} if wants and not args.enable_lora else {}


def _lora_module(text: str) -> LoRAModule:
    """argparse's type for ``--lora-modules`` (its errors read as a usage error naming the flag)."""
    try:
        return parse_lora_module(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
