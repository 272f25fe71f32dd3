"""What a request names to run on an adapter."""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, frozen=True):
    """A LoRA adapter for a request: ``name`` (what the server's ``model`` field says), ``id`` (a positive int,
    unique per adapter: it keys the prefix cache, so requests of different adapters never share blocks) and
    ``path``, a PEFT checkpoint directory (``adapter_config.json`` and ``adapter_model.safetensors``)."""

    name: str
    id: int
    path: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"LoRARequest name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.id, int) or isinstance(self.id, bool) or self.id < 1:
            raise ValueError(f"LoRARequest {self.name!r}: id must be an int >= 1, got {self.id!r}")
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"LoRARequest {self.name!r}: path must be a non-empty string, got {self.path!r}")
