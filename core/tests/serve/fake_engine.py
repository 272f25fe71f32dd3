"""A deterministic stand-in for LLMEngine: characters are tokens, each step appends one letter per sequence."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from paged_core.api import CompletionOutput, PrefixCacheStats, RequestMetrics, RequestOutput, SamplingParams
from paged_core.errors import RequestRejectedError

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
    """Sequence ``j`` of a request emits ``'a' + j`` each step until ``max_tokens``; logprobs are ``-0.5``."""

    def __init__(self, max_len: int = 100) -> None:
        self.tokenizer = CharTokenizer()
        config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(vocab_size=VOCAB))
        self.loaded = SimpleNamespace(model=SimpleNamespace(config=config), source=SimpleNamespace(name="fake"))
        self.pool = SimpleNamespace(usage=0.0, num_free_blocks=10, num_usable_blocks=10)
        self.scheduler = SimpleNamespace(max_len=max_len, kv=SimpleNamespace(pool=self.pool, stats=PrefixCacheStats()),
                                         config=SimpleNamespace(max_num_seqs=256),
                                         num_running=0, num_waiting=0, num_preemptions=0)  # fmt: skip
        from paged_core.engine.executors import StepStats

        self.runner = SimpleNamespace(executor=SimpleNamespace(mode="eager", stats=StepStats()))
        self.groups: dict[str, dict[str, Any]] = {}
        self.fail_next_step = False
        self.aborted: list[str] = []

    def add_request(self, prompt: list[int], params: SamplingParams, *, request_id: str, cache_salt: str | None = None,
                    priority: int = 0) -> str:  # fmt: skip
        if REFUSED_TOKEN in prompt:
            raise RequestRejectedError("SamplingParams.max_tokens must be refused for this prompt")
        self.groups[request_id] = {"prompt": list(prompt), "params": params, "tokens": [[] for _ in range(params.n)],
                                   "metrics": RequestMetrics(arrival_time=time.monotonic(),
                                                             num_prompt_tokens=len(prompt))}  # fmt: skip
        self._sync()
        return request_id

    def abort_request(self, ids: list[str]) -> None:
        for rid in ids:
            if self.groups.pop(rid, None) is not None:
                self.aborted.append(rid)
        self._sync()

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    def step(self) -> list[RequestOutput]:
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("simulated kernel failure")
        time.sleep(0.002)  # a step takes time, so requests overlap
        outputs = []
        for rid, g in list(self.groups.items()):
            p: SamplingParams = g["params"]
            outs = []
            for j, toks in enumerate(g["tokens"]):
                tok = ord("a") + j
                toks.append(tok)
                done = len(toks) >= p.max_tokens
                outs.append(CompletionOutput(
                    index=j, text="".join(map(chr, toks)), token_ids=list(toks),
                    finish_reason="length" if done else None,
                    logprobs=[{t: -0.5, 200: -1.5} for t in toks] if p.logprobs is not None else None,
                    new_text=chr(tok), new_token_ids=[tok],
                ))  # fmt: skip
            m: RequestMetrics = g["metrics"]
            if m.first_token_time is None:
                m.first_token_time = time.monotonic()
            finished = all(o.finish_reason for o in outs)
            if finished:
                m.finished_time = time.monotonic()
                del self.groups[rid]
            outputs.append(RequestOutput(rid, None, g["prompt"], outs, finished, m))
        self._sync()
        return outputs

    def _sync(self) -> None:
        self.scheduler.num_running = len(self.groups)
        self.pool.usage = min(1.0, len(self.groups) / 10)
