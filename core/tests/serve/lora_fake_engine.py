"""A :class:`FakeEngine` that loads LoRA adapters as the real core's utility calls do, and remembers what ran on
which adapter (an adapter's sequences emit the letter ``'k' + id`` instead of ``'a'``, so a body shows it too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paged_core.engine_core.messages import CoreOutputs, CoreRequest, SeqDelta
from paged_core.lora.request import LoRARequest

from .fake_engine import FakeEngine


class LoRAFakeEngine(FakeEngine):
    """``load_lora`` accepts a directory holding ``adapter_config.json`` and answers the problem's text otherwise;
    ``remove_lora`` forgets the id (``removed`` lists every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.registered: dict[int, LoRARequest] = {}
        self.removed: list[int] = []
        self.loras: dict[str, LoRARequest | None] = {}
        """Each request id the core saw, with its adapter."""

    def call(self, method: str, *args: Any) -> Any:
        if method == "load_lora":
            lora = LoRARequest(*args)
            if not (Path(lora.path) / "adapter_config.json").is_file():
                return f"LoRA adapter {lora.name!r} ({lora.path}): adapter_config.json is missing"
            self.registered[lora.id] = lora
            return None
        if method == "remove_lora":
            self.removed.append(args[0])
            return self.registered.pop(args[0], None) is not None
        return super().call(method)

    def add_request(self, request: CoreRequest) -> None:
        self.loras[request.request_id] = request.lora
        super().add_request(request)

    def step(self) -> CoreOutputs:
        outputs = super().step()
        for i, d in enumerate(outputs.deltas):
            lora = self.loras.get(d.request_id)
            if lora is not None and d.new_token_ids:  # 'k' + id: which adapter ran shows in the text
                token = ord("k") + lora.id
                outputs.deltas[i] = SeqDelta(
                    d.request_id,
                    d.index,
                    [token],
                    d.new_logprobs,
                    d.finish_reason,
                    d.stop_reason,
                    d.num_cached_tokens,
                    d.error,
                )
        return outputs


def adapter_dir(root: Path, name: str) -> str:
    """A directory the fake core accepts as an adapter."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text("{}")
    return str(path)
