"""Shared fixtures for end-to-end tests: the embedded model loaded once, and transformers' greedy output."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from paged_core import LLM
from paged_core.registry import load_registry

from .e2e_helpers import GREEDY, cpu_linear_activations, cpu_linear_activations_mode, hf_greedy, mixed_prompts

# The fastest installed CPU backend runs the parity tests; the reference backend checks the single-prompt case.
PREFERRED = ("cpu", "example")


def fast_backend() -> str:
    """The first of :data:`PREFERRED` that is installed and available."""
    names = {r.name for r in load_registry().records() if r.selectable}
    for name in PREFERRED:
        if name in names:
            return name
    return "reference"


DEFAULT_ACTIVATIONS = cpu_linear_activations_mode()
"""The cpu backend's packed-linear activations as a user's process starts (read before any fixture changes them)."""

VARIANTS = {
    "fused-eager": {"model_impl": "fused", "graph_mode": "eager"},
    "transformers-eager": {"model_impl": "transformers", "graph_mode": "eager"},
    "fused-compiled": {"model_impl": "fused", "graph_mode": "compiled"},
}
"""Every model path and every graph mode a CPU offers (device graphs need a GPU: see ci/cuda-device)."""
SMOL_VARIANTS = ("fused-eager", "transformers-eager") + (
    ("fused-compiled",) if os.environ.get("PAGED_E2E_SMOL_COMPILED") == "1" else ()
)
"""The embedded model's battery skips ``compiled`` by default: inductor takes minutes for its 30 layers on two
cores, too long for CI; the tiny Qwen3 and Mistral models run the whole battery compiled instead.
``PAGED_E2E_SMOL_COMPILED=1`` adds it (a manual run: ``pytest tests/e2e/test_greedy_parity.py``)."""


@pytest.fixture(scope="module")
def exact_activations() -> Iterator[None]:
    """Parity with transformers' fp32 dequantized model, token for token: the cpu backend's packed linears keep
    fp32 activations. By default they round them to int8 (two levels, at every row count: batch-invariant, but not
    the dequantized model's arithmetic). test_packed_weights.py measures the default itself (its NLL against the
    dequantized model), test_batch_invariance.py its invariance.

    Not autouse: the files that compare the embedded model with transformers ask for it
    (``pytestmark = pytest.mark.usefixtures("exact_activations")``); the others, test_batch_invariance.py
    among them, run the backend's defaults as a user gets them. Module scope, so it is undone before the next
    file runs on the same worker (a session fixture would stay on for every later file).
    """
    with cpu_linear_activations("fp32"):
        yield


@pytest.fixture(scope="session")
def smol_base() -> LLM:
    """The embedded SmolLM2 in fp32 on the fastest CPU backend, room for ~11k tokens of KV (defaults otherwise)."""
    return LLM(backend=fast_backend(), dtype="float32", kv_cache_memory="512MiB")


@pytest.fixture(scope="session", params=SMOL_VARIANTS)
def smol(request: pytest.FixtureRequest, smol_base: LLM) -> LLM:
    """:func:`smol_base` on one model path and graph mode (the parity battery runs once per variant)."""
    llm = smol_base.reconfigured(**VARIANTS[request.param])
    runner = llm.engine.core.runner
    assert (runner.forward_impl.name, runner.graph_mode) == tuple(VARIANTS[request.param].values())
    return llm


@pytest.fixture(scope="session")
def prompts32(smol_base: LLM) -> list[list[int]]:
    return mixed_prompts(smol_base.tokenizer, 32)


@pytest.fixture(scope="session")
def hf32(smol_base: LLM, prompts32: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of the 32 mixed prompts (computed once).

    With exact activations itself: a session fixture is made before any module's ``exact_activations``."""
    with cpu_linear_activations("fp32"):
        return hf_greedy(smol_base, prompts32, GREEDY.max_tokens)
