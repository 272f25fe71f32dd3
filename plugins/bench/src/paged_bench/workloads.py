"""The seeded benchmark workloads: same names, same requests on every machine, so figures compare.

Every generator draws from its own ``random.Random(seed)``, so a workload
depends only on its arguments; ``num_requests`` shrinks a workload to its
first requests (the first ``k`` requests of a workload are the same whatever
``num_requests`` is), which keeps quick runs comparable with full ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

# Random prompt ids are drawn from [TOKEN_LOW, TOKEN_HIGH): clear of the special
# tokens at the bottom of most vocabularies, inside any vocabulary of >= 40k ids.
TOKEN_LOW = 100
TOKEN_HIGH = 40000

# ShareGPT means as reported by the PagedAttention paper (input 161, output 338 tokens);
# sigma 1.0 gives the long right tail of chat traffic.
SHAREGPT_PROMPT_MEAN = 161.0
SHAREGPT_OUTPUT_MEAN = 338.0
SHAREGPT_SIGMA = 1.0


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: prompt token ids and how many tokens to generate (EOS ignored)."""

    prompt_token_ids: list[int]
    max_tokens: int

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens: the request's length when it finishes."""
        return len(self.prompt_token_ids) + self.max_tokens


def _check_count(name: str, value: int, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(n)]


def throughput(num_requests: int = 256, seed: int = 0) -> list[BenchRequest]:
    """``throughput``: prompts of 32-512 random ids from [100, 40000), 32-256 output tokens each."""
    _check_count("num_requests", num_requests)
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        prompt = [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(rng.randint(32, 512))]
        out.append(BenchRequest(prompt, rng.randint(32, 256)))
    return out


def prefix(
    num_requests: int = 64, seed: int = 0, shared_len: int = 1024, suffix_len: int = 64, max_tokens: int = 32
) -> list[BenchRequest]:
    """``prefix``: one shared ``shared_len``-token system prompt plus a unique ``suffix_len``-token suffix each."""
    _check_count("num_requests", num_requests)
    _check_count("shared_len", shared_len, 0)
    _check_count("suffix_len", suffix_len)
    _check_count("max_tokens", max_tokens)
    rng = random.Random(seed)
    shared = _ids(rng, shared_len)
    return [BenchRequest(shared + _ids(rng, suffix_len), max_tokens) for _ in range(num_requests)]


def decode_1(seed: int = 0, prompt_len: int = 32, max_tokens: int = 256) -> list[BenchRequest]:
    """``decode-1``: a single request (a short random prompt) generating ``max_tokens`` tokens."""
    _check_count("prompt_len", prompt_len)
    _check_count("max_tokens", max_tokens)
    return [BenchRequest(_ids(random.Random(seed), prompt_len), max_tokens)]


def edit_1(seed: int = 0, segment_len: int = 48, copies: int = 3, max_tokens: int = 128) -> list[BenchRequest]:
    """``edit-1``: one request whose output repeats its prompt, the case prompt-lookup speculation is for.

    The prompt is a random segment written ``copies`` times, then its first 8 tokens again: a model
    continues such a text by copying it (what an edit or a quote does), so the output repeats the prompt.
    """
    _check_count("segment_len", segment_len, 9)
    _check_count("copies", copies)
    _check_count("max_tokens", max_tokens)
    segment = _ids(random.Random(seed), segment_len)
    return [BenchRequest(segment * copies + segment[:8], max_tokens)]


def long(num_requests: int = 8, seed: int = 0, context_len: int = 4096, max_tokens: int = 128) -> list[BenchRequest]:
    """``long``: ``num_requests`` prompts of ``context_len`` random ids, each decoding ``max_tokens`` tokens."""
    _check_count("num_requests", num_requests)
    _check_count("context_len", context_len)
    _check_count("max_tokens", max_tokens)
    rng = random.Random(seed)
    return [BenchRequest(_ids(rng, context_len), max_tokens) for _ in range(num_requests)]


def _lognormal_int(rng: random.Random, mean: float, low: int, high: int) -> int:
    mu = math.log(mean) - SHAREGPT_SIGMA**2 / 2  # so the (unclipped) mean is ``mean``
    return max(low, min(high, round(rng.lognormvariate(mu, SHAREGPT_SIGMA))))


def kv_util(num_requests: int = 1000, seed: int = 0, max_len: int = 2048) -> list[BenchRequest]:
    """``kv-util``: ShareGPT-like lognormal prompt and output lengths, each request at most ``max_len`` tokens.

    Prompts are capped at half of ``max_len`` and outputs at what is left, so
    every request fits the length limit the reservation baseline reserves.
    """
    _check_count("num_requests", num_requests)
    _check_count("max_len", max_len, 2)
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        p = _lognormal_int(rng, SHAREGPT_PROMPT_MEAN, 1, max_len // 2)
        o = _lognormal_int(rng, SHAREGPT_OUTPUT_MEAN, 1, max_len - p)
        out.append(BenchRequest(_ids(rng, p), o))
    return out


def _decode_1(num_requests: int, seed: int) -> list[BenchRequest]:
    if num_requests != 1:
        raise ValueError(f"decode-1 is a single request; num_requests must be 1, got {num_requests}")
    return decode_1(seed)


def _edit_1(num_requests: int, seed: int) -> list[BenchRequest]:
    if num_requests != 1:
        raise ValueError(f"edit-1 is a single request; num_requests must be 1, got {num_requests}")
    return edit_1(seed)


WORKLOADS: dict[str, tuple[int, Callable[[int, int], list[BenchRequest]]]] = {
    "throughput": (256, throughput),
    "prefix": (64, prefix),
    "kv-util": (1000, kv_util),
    "decode-1": (1, _decode_1),
    "edit-1": (1, _edit_1),
    "long": (8, long),
}
"""Workload name -> (default number of requests, generator taking ``(num_requests, seed)``)."""


def build(name: str, num_requests: int | None = None, seed: int = 0) -> list[BenchRequest]:
    """The requests of workload ``name`` (its default size unless ``num_requests`` is given)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    default, make = WORKLOADS[name]
    return make(default if num_requests is None else num_requests, seed)


def cap_output(requests: list[BenchRequest], max_tokens: int | None) -> list[BenchRequest]:
    """The same requests with at most ``max_tokens`` output tokens each (for quick runs); ``None`` keeps them."""
    if max_tokens is None:
        return requests
    _check_count("max_tokens", max_tokens)
    return [BenchRequest(r.prompt_token_ids, min(r.max_tokens, max_tokens)) for r in requests]


def fit_vocab(requests: list[BenchRequest], vocab_size: int) -> list[BenchRequest]:
    """The same requests with prompt ids folded into ``[TOKEN_LOW, vocab_size)`` where the model's vocabulary is
    smaller than the workloads' id range (tiny test models); a larger vocabulary keeps them as drawn."""
    if vocab_size >= TOKEN_HIGH:
        return requests
    span = vocab_size - TOKEN_LOW
    if span < 1:
        raise ValueError(f"a vocabulary of {vocab_size} tokens leaves no ids above the {TOKEN_LOW} kept for specials")
    return [
        BenchRequest([TOKEN_LOW + (t - TOKEN_LOW) % span for t in r.prompt_token_ids], r.max_tokens) for r in requests
    ]
