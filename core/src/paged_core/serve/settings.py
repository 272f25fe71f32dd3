"""ServeConfig: the server's own settings (address, auth, request limits), validated up front."""

from __future__ import annotations

from dataclasses import dataclass

from paged_core.errors import ConfigError
from paged_core.serve.lora_modules import LoRAModule, check_modules

MiB = 1 << 20


@dataclass(frozen=True)
class ServeConfig:
    """How ``paged serve`` listens and what it accepts.

    ``api_key`` turns on bearer-token auth for the API routes (``/health``
    and ``/metrics`` stay open for probes and scrapers). ``max_tokens_limit``
    caps ``max_tokens`` per request (``None``: only the context length caps
    it); ``max_n`` caps ``n``; ``max_prompts`` caps a batched ``prompt``
    list; ``max_body_bytes`` caps the request body.
    ``allow_special_tokens_in_content`` lets chat message content contain
    the tokenizer's control-token text (refused by default: it would let a
    user forge turns such as a system message).

    Overload: at most ``max_num_seqs + max_queued_requests`` engine sequences
    are in flight; past that a generation request is answered 429 with
    ``Retry-After`` (see :mod:`paged_core.serve.admission`). Connections are
    closed when idle (no request under way) for ``idle_timeout`` seconds, when
    a request's headers take over ``header_timeout`` seconds to arrive, or its
    body over ``body_timeout`` seconds (see :mod:`paged_core.serve.timeouts`).
    After SIGTERM or Ctrl-C, requests in flight get ``drain_timeout`` seconds to
    finish; then each ends with an error event (see :mod:`paged_core.serve.drain`).

    Tool calls: ``enable_auto_tool_choice`` lets ``tool_choice: "auto"`` through, its output read by the
    parser named ``tool_call_parser`` (see :mod:`paged_core.serve.tools`); an unknown name is refused here.
    ``chat_template`` (Jinja text) replaces the model's own chat template for every chat request, e.g. one
    that offers tools where the model's does not.

    LoRA: ``lora_modules`` are loaded (and checked) as the server starts, each served under its name (the engine
    needs ``enable_lora``); ``enable_lora_runtime_updates`` adds ``POST /v1/load_lora_adapter`` and
    ``/v1/unload_lora_adapter`` (see :mod:`paged_core.serve.lora`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    max_body_bytes: int = 4 * MiB
    max_tokens_limit: int | None = None
    max_n: int = 16
    max_prompts: int = 64
    allow_special_tokens_in_content: bool = False
    log_level: str = "info"
    max_queued_requests: int = 256
    idle_timeout: float = 5.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    drain_timeout: float = 5.0
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    chat_template: str | None = None
    lora_modules: tuple[LoRAModule, ...] = ()
    enable_lora_runtime_updates: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an int in [0, 65535], got {self.port!r}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must be a non-empty string (or unset for no auth)")
        for name in ("max_body_bytes", "max_n", "max_prompts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        limit = self.max_tokens_limit
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ConfigError(f"max_tokens_limit must be an int >= 1 or None, got {limit!r}")
        queued = self.max_queued_requests
        if not isinstance(queued, int) or isinstance(queued, bool) or queued < 0:
            raise ConfigError(f"max_queued_requests must be an int >= 0, got {queued!r}")
        for name in ("idle_timeout", "header_timeout", "body_timeout", "drain_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 3600:
                raise ConfigError(f"{name} must be a number of seconds in (0, 3600], got {value!r}")
        if self.tool_call_parser is not None:
            from paged_core.serve.tools.registry import tool_parser_class  # the serve extra's, loaded only when set

            tool_parser_class(self.tool_call_parser)
        check_modules(self.lora_modules)
        if self.served_model_name is not None and any(m.name == self.served_model_name for m in self.lora_modules):
            raise ConfigError(f"LoRA module name {self.served_model_name!r} is the base model's served name")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ConfigError("enable_auto_tool_choice needs a tool_call_parser (--tool-call-parser NAME)")
