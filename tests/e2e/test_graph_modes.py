"""The engine's graph-mode plumbing end to end on a CPU.

Device graphs need a GPU (``ci/cuda-device`` runs them there), but everything around the capture (static
buffers, padding to a capture size, the frozen host ints, dispatch, eager fallback and the counters) is the
core's, so it is checked here: a reference backend that declares uniform-decode capture runs the engine's
``device`` executor with a recording strategy that replays by calling the step again on the static buffers.
Greedy output must equal transformers' token for token, decode steps must be replayed, prefills must fall back.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from paged_core import LLMEngine
from paged_core.api import BackendCapabilities, EagerStrategy, GraphSupport, UnsupportedConfigError
from paged_core.frontend.llm import LLM
from paged_core.reference.backend import ReferenceBackend
from paged_core.runner import executors

from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .tiny_models import VOCAB, save_tiny_model


class CapturingReference(ReferenceBackend):
    """The reference kernels, declared capturable for uniform decode (its host reads are fine when replay is eager)."""

    name = "reference-capture"

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return dataclasses.replace(ReferenceBackend.capabilities(), graph_support=GraphSupport.UNIFORM_DECODE)


@pytest.mark.parametrize("model_impl", ["fused", "transformers"])
def test_device_mode_replays_decodes_and_matches_transformers(
    model_impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save_tiny_model("qwen3", tmp_path)
    base = LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 60))] for _ in range(6)]
    params = dataclasses.replace(GREEDY, max_tokens=12)
    want = hf_greedy(base, prompts, params.max_tokens, attn="eager")

    # No GPU here: the executor's device strategy becomes a recording one (capture stores, replay calls).
    monkeypatch.setattr(executors, "device_graph_refusal", lambda backend: None)
    monkeypatch.setattr(executors, "DeviceGraphStrategy", lambda device_type: EagerStrategy())
    loaded = dataclasses.replace(base.engine.loaded, backend=CapturingReference(device="cpu"))
    config = base.engine.config.replace(graph_mode="device", model_impl=model_impl, capture_sizes=(1, 2, 4, 8))
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(config, loaded)
    assert llm.engine.core.runner.graph_mode == "device"
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert_same_tokens(outs, want)
    stats = llm.engine.core.runner.executor.stats
    assert stats.replays > 0, stats  # decode batches of 1..6 rows are padded to 1, 2, 4 or 8 and replayed
    assert stats.eager_steps > 0 and set(stats.fallback_reasons) <= {
        "not a uniform decode batch",
        "a row does not sample (chunked prefill)",
    }, stats
    assert stats.replays + stats.eager_steps == stats.steps


def test_device_mode_is_refused_on_a_cpu_with_the_working_modes(tmp_path: Path) -> None:
    path = save_tiny_model("qwen3", tmp_path)
    with pytest.raises(UnsupportedConfigError, match=r"graph_mode='device' refused: .*work here: eager, compiled"):
        LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB", graph_mode="device")
