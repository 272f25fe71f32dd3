"""``--lora-modules``: the adapters a server starts with, as ``name=path`` or vLLM's JSON form.

Pure parsing (no server libraries), so ``paged serve``'s parser can use it on any install.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from paged_core.errors import ConfigError

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM's switch for the runtime load/unload routes, honoured as ``--enable-lora-runtime-updates``'s default."""


@dataclass(frozen=True)
class LoRAModule:
    """One adapter to serve: clients send ``name`` as the request's ``model``; ``path`` is a PEFT checkpoint
    directory. ``base_model_name`` is vLLM's optional field, accepted and not needed (one base model is served)."""

    name: str
    path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        for field in ("name", "path"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"LoRA module {field} must be a non-empty string, got {value!r}")
        if self.base_model_name is not None and not isinstance(self.base_model_name, str):
            raise ConfigError(f"LoRA module {self.name!r}: base_model_name must be a string")


def parse_lora_module(text: str) -> LoRAModule:
    """``name=path``, or a JSON object ``{"name", "path", "base_model_name"?}``; a :class:`ConfigError` says what
    is wrong."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data: Any = json.loads(stripped)
        except ValueError as exc:
            raise ConfigError(f"--lora-modules {text!r} is not valid JSON: {exc}") from None
        unknown = sorted(set(data) - {"name", "path", "base_model_name"})
        if unknown:
            raise ConfigError(f"--lora-modules {text!r}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in ("name", "path") if k not in data]
        if missing:
            raise ConfigError(f"--lora-modules {text!r}: missing {' and '.join(missing)}")
        return LoRAModule(data["name"], data["path"], data.get("base_model_name"))
    name, sep, path = stripped.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ConfigError(f"--lora-modules takes name=path or a JSON object, got {text!r}")
    return LoRAModule(name.strip(), path.strip())


def check_modules(modules: tuple[LoRAModule, ...]) -> None:
    """Refuse two modules of one name (each name must pick one adapter)."""
    seen: set[str] = set()
    for module in modules:
        if not isinstance(module, LoRAModule):
            raise ConfigError(f"lora_modules must hold LoRAModule entries, got {module!r}")
        if module.name in seen:
            raise ConfigError(f"LoRA module name {module.name!r} is given twice")
        seen.add(module.name)


def runtime_updates_from_env() -> bool:
    """Whether vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` asks for the runtime load/unload routes (1 or true)."""
    return os.environ.get(RUNTIME_UPDATES_ENV, "").strip().lower() in ("1", "true")
