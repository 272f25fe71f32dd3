"""A deterministic stand-in for EngineCore: characters are tokens, each step appends one letter per sequence."""

from __future__ import annotations

import time
from typing import Any

from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest, SchedulerStats, SeqDelta
from paged_core.errors import RequestRejectedError
from paged_core.sampling.params import SamplingParams

VOCAB = 1000
REFUSED_TOKEN = 999  # a prompt containing this id is refused by add_request


class CharTokenizer:
    """Token id = code point; a chat template joins ``role:content`` turns."""

    chat_template = "{{ fake }}"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return chr(token_id)

    def apply_chat_template(self, conv: list[dict[str, Any]], add_generation_prompt: bool, tokenize: bool) -> list[int]:
        text = "|".join(f"{m['role']}:{m['content']}" for m in conv)
        return self.encode(text + ("|assistant:" if add_generation_prompt else ""))


class FakeEngine:
    """An engine core: sequence ``j`` of a request emits ``'a' + j`` each step until ``max_tokens``.

    Logprobs are ``-0.5`` for the token and ``-1.5`` for token 200.
    """

    def __init__(self, max_len: int = 100) -> None:
        self.tokenizer = CharTokenizer()
        self.max_len = max_len
        self.groups: dict[str, dict[str, Any]] = {}
        self.fail_next_step = False
        self.aborted: list[str] = []
        self.steps = 0

    def facts(self) -> CoreFacts:
        return CoreFacts(
            model_name="fake",
            model_source="fake",
            vocab_size=VOCAB,
            eos_token_ids=[],
            max_model_len=self.max_len,
            block_size=16,
            num_usable_blocks=10,
            max_num_seqs=256,
            backend="fake",
            dtype="float32",
            graph_mode="eager",
            model_path="fake",
        )

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            kv_usage=min(1.0, len(self.groups) / 10),
            num_free_blocks=10,
            num_usable_blocks=10,
            num_running=len(self.groups),
            steps=self.steps,
        )

    def close(self) -> None:
        """Nothing to release (a real core stops its tensor-parallel workers here)."""

    def call(self, method: str) -> Any:
        return True

    def add_request(self, request: CoreRequest) -> None:
        if REFUSED_TOKEN in request.prompt_token_ids:
            raise RequestRejectedError("SamplingParams.max_tokens must be refused for this prompt")
        n = request.params.n
        self.groups[request.request_id] = {
            "params": request.params,
            "tokens": [[] for _ in range(n)],
            "done": [False] * n,
        }

    def abort(self, abort: CoreAbort) -> None:
        for rid in abort.request_ids:
            if self.groups.pop(rid, None) is not None:
                self.aborted.append(rid)
        for rid, index in abort.sequences:
            g = self.groups.get(rid)
            if g is not None:
                g["done"][index] = True
                if all(g["done"]):
                    del self.groups[rid]

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    def step(self) -> CoreOutputs:
        self.steps += 1
        if self.fail_next_step:
            self.fail_next_step = False
            failed = dict.fromkeys(self.groups, "the engine step running this request failed (RuntimeError)")
            deltas = [SeqDelta(rid, 0, [], finish_reason="abort", error=why) for rid, why in failed.items()]
            self.groups.clear()
            return CoreOutputs(deltas, self.stats(), failed, step_error="RuntimeError('simulated kernel failure')")
        time.sleep(0.002)  # a step takes time, so requests overlap
        deltas = []
        for rid, g in list(self.groups.items()):
            p: SamplingParams = g["params"]
            for j, toks in enumerate(g["tokens"]):
                if g["done"][j]:
                    continue
                tok = ord("a") + j
                toks.append(tok)
                done = len(toks) >= p.max_tokens
                deltas.append(
                    SeqDelta(
                        rid,
                        j,
                        [tok],
                        [{tok: -0.5, 200: -1.5}] if p.logprobs is not None else None,
                        finish_reason="length" if done else None,
                        num_cached_tokens=0 if len(toks) == 1 else -1,
                    )
                )
                g["done"][j] = done
            if all(g["done"]):
                del self.groups[rid]
        return CoreOutputs(deltas, self.stats())
