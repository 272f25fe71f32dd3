"""Shared fixtures for end-to-end tests: the embedded model loaded once, and transformers' greedy output."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from paged_core.api import LLM, load_registry

from .e2e_helpers import GREEDY, hf_greedy, mixed_prompts

# The fastest installed CPU backend runs the parity tests; the reference backend checks the single-prompt case.
PREFERRED = ("cpu", "example")


def fast_backend() -> str:
    """The first of :data:`PREFERRED` that is installed and available."""
    names = {r.name for r in load_registry().records() if r.selectable}
    for name in PREFERRED:
        if name in names:
            return name
    return "reference"


@pytest.fixture(scope="session")
def smol() -> LLM:
    """The embedded SmolLM2 in fp32 on the fastest CPU backend, room for ~11k tokens of KV."""
    return LLM(backend=fast_backend(), dtype="float32", kv_cache_memory="512MiB")


@pytest.fixture(scope="session")
def prompts32(smol: LLM) -> list[list[int]]:
    return mixed_prompts(smol.tokenizer, 32)


@pytest.fixture(scope="session")
def hf32(smol: LLM, prompts32: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of the 32 mixed prompts (computed once)."""
    return hf_greedy(smol, prompts32, GREEDY.max_tokens)
