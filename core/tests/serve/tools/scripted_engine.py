"""A fake engine core that answers every request with a scripted text, one character (token) per step."""

from __future__ import annotations

import json
from typing import Any

from paged_core.engine_core.messages import CoreOutputs, SeqDelta

from ..fake_engine import CharTokenizer, FakeEngine


class ToolTemplateTokenizer(CharTokenizer):
    """Renders ``tools`` and the tool parts of messages, so tests can see what reached the template."""

    def apply_chat_template(
        self, conv: list[dict[str, Any]], add_generation_prompt: bool, tokenize: bool, **kwargs: Any
    ) -> list[int]:
        turns = [json.dumps(m, sort_keys=True) for m in conv]
        if kwargs.get("tools"):
            turns.insert(0, "tools:" + json.dumps(kwargs["tools"], sort_keys=True))
        return self.encode("|".join(turns) + ("|assistant:" if add_generation_prompt else ""))


class ScriptedEngine(FakeEngine):
    """Sequence ``j`` writes ``script`` one character per step and stops (``finish_reason`` stop) at its end."""

    def __init__(self, script: str = "", max_len: int = 4000) -> None:
        super().__init__(max_len)
        self.tokenizer = ToolTemplateTokenizer()
        self.script = script
        self.prompts: list[str] = []

    def add_request(self, request: Any) -> None:
        self.prompts.append(self.tokenizer.decode(list(request.prompt_token_ids)))
        super().add_request(request)

    def step(self) -> CoreOutputs:
        self.steps += 1
        deltas = []
        for rid, g in list(self.groups.items()):
            for j, toks in enumerate(g["tokens"]):
                if g["done"][j]:
                    continue
                toks.append(ord(self.script[len(toks)]))
                done = len(toks) >= min(len(self.script), g["params"].max_tokens)
                reason = ("stop" if len(toks) == len(self.script) else "length") if done else None
                deltas.append(SeqDelta(rid, j, [toks[-1]], None, finish_reason=reason))
                g["done"][j] = done
            if all(g["done"]):
                del self.groups[rid]
        return CoreOutputs(deltas, self.stats())
