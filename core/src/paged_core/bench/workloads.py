"""The seeded benchmark workloads: same names, same requests on every machine, so figures compare."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: prompt token ids and how many tokens to generate (EOS ignored)."""

    prompt_token_ids: list[int]
    max_tokens: int


def throughput(num_requests: int = 256, seed: int = 0) -> list[BenchRequest]:
    """``throughput``: prompts of 32-512 random ids from [100, 40000), 32-256 output tokens each."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(32, 512))]
        out.append(BenchRequest(prompt, rng.randint(32, 256)))
    return out
