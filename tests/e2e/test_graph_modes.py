"""The engine's graph-mode plumbing end to end on a CPU.

Device graphs need a GPU (``ci/cuda-device`` runs them there), but everything around the capture (static
buffers, padding to a capture size, the frozen host ints, dispatch, eager fallback and the counters) is the
core's, so it is checked here: a reference backend that declares uniform-decode capture and returns its own
recording strategy (replay calls the step again on the static buffers) runs the engine's ``device``
executor, which must take the backend's strategy. Greedy output must equal transformers' token for token,
decode steps must be replayed through that strategy, prefills must fall back; a strategy that raises on
capture or on replay turns its sizes eager, counted by reason, and fails no request.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

from paged_core import LLMEngine
from paged_core.api import UnsupportedConfigError
from paged_core.frontend.llm import LLM
from paged_core.runner.device_executor import DeviceGraphExecutor

from .e2e_helpers import GREEDY, assert_same_tokens, hf_greedy
from .graph_doubles import CapturingReference, RecordingStrategy
from .tiny_models import VOCAB, save_tiny_model


def _device_llm(base: LLM, strategy: RecordingStrategy, model_impl: str = "fused") -> LLM:
    """An LLM on ``base``'s weights whose backend declares capture with ``strategy``, in graph_mode='device'."""
    loaded = dataclasses.replace(base.engine.loaded, backend=CapturingReference(strategy))
    config = base.engine.config.replace(graph_mode="device", model_impl=model_impl, capture_sizes=(1, 2, 4, 8))
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(config, loaded)
    assert llm.engine.core.runner.graph_mode == "device"
    return llm


@pytest.mark.parametrize("model_impl", ["fused", "transformers"])
def test_device_mode_replays_decodes_and_matches_transformers(model_impl: str, tmp_path: Path) -> None:
    path = save_tiny_model("qwen3", tmp_path)
    base = LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 60))] for _ in range(6)]
    params = dataclasses.replace(GREEDY, max_tokens=12)
    want = hf_greedy(base, prompts, params.max_tokens, attn="eager")

    # No GPU here: the backend's own strategy records its calls (capture stores, replay calls the step again).
    strategy = RecordingStrategy()
    llm = _device_llm(base, strategy, model_impl)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert_same_tokens(outs, want)
    stats = llm.engine.core.runner.executor.stats
    assert stats.replays > 0, stats  # decode batches of 1..6 rows are padded to 1, 2, 4 or 8 and replayed
    assert strategy.calls == Counter(capture=4, replay=stats.replays), strategy.calls  # the engine used it
    assert stats.eager_steps > 0 and set(stats.fallback_reasons) == {"not a uniform decode batch"}, stats
    assert stats.replays + stats.eager_steps == stats.steps


@pytest.mark.parametrize("fail_on", ["capture", "replay"])
def test_a_strategy_that_raises_turns_its_sizes_eager_and_fails_no_request(fail_on: str, tmp_path: Path) -> None:
    path = save_tiny_model("qwen3", tmp_path)
    base = LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 30))] for _ in range(3)]
    params = dataclasses.replace(GREEDY, max_tokens=6)
    want = hf_greedy(base, prompts, params.max_tokens, attn="eager")

    strategy = RecordingStrategy(fail_on=fail_on)
    llm = _device_llm(base, strategy)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert_same_tokens(outs, want)
    stats = llm.engine.core.runner.executor.stats
    reason = f"graph strategy {fail_on} raised RuntimeError"
    assert stats.replays == 0 and stats.fallback_reasons[reason] > 0, stats
    assert stats.eager_steps == stats.steps
    # The reason travels with the core's stats (what /metrics renders as paged_graph_fallbacks_total{reason}).
    assert llm.engine.core.stats().graph_fallbacks[reason] == stats.fallback_reasons[reason]
    if fail_on == "replay":  # a size that failed once is never replayed again: one try per size in the batch
        executor = llm.engine.core.runner.executor
        assert isinstance(executor, DeviceGraphExecutor)
        assert strategy.calls["replay"] == len(executor.graphs.failures)


def test_device_mode_is_refused_on_a_cpu_with_the_working_modes(tmp_path: Path) -> None:
    path = save_tiny_model("qwen3", tmp_path)
    with pytest.raises(UnsupportedConfigError, match=r"graph_mode='device' refused: .*work here: eager, compiled"):
        LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB", graph_mode="device")


def _metric(text: str, name: str, label: str) -> float:
    """The value of ``name{...label...}`` in a /metrics page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_example_backends_strategy_runs_in_generate_and_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An out-of-tree backend's strategy (the example's, counting its calls) captures at start, replays decodes."""
    import httpx

    from paged_backend_example import ExampleBackend
    from paged_core.serve import ServeConfig, build_app

    from ..serve.serve_helpers import ServerThread

    # The example compiles with inductor; aot_eager traces the same graphs without generating code (seconds).
    monkeypatch.setattr(ExampleBackend, "compile_backend", "aot_eager")
    path = save_tiny_model("qwen3", tmp_path)
    llm = LLM(
        str(path),
        backend="example",
        dtype="float32",
        kv_cache_memory="8MiB",
        graph_mode="device",
        capture_sizes=(1, 2, 4),
    )
    backend = llm.engine.core.runner.backend
    assert isinstance(backend, ExampleBackend)
    assert backend.graph_calls.captures == Counter({1: 1, 2: 1, 4: 1}), backend.graph_calls  # at start
    rng = random.Random(7)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(3)]
    params = dataclasses.replace(GREEDY, max_tokens=8)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert_same_tokens(outs, hf_greedy(llm, prompts, params.max_tokens, attn="eager"))
    stats = llm.engine.core.runner.executor.stats
    replays = sum(backend.graph_calls.replays.values())
    assert replays == stats.replays > 0, (backend.graph_calls, stats)  # every replayed step went to the strategy

    with ServerThread(build_app(llm.engine.core, ServeConfig(served_model_name="tiny"))) as server:
        body = {"model": "tiny", "prompt": prompts[0], "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        metrics = httpx.get(f"{server.url}/metrics", timeout=60).text
    assert sum(backend.graph_calls.replays.values()) >= replays + 3  # the request's decode steps replayed
    assert _metric(metrics, "paged_graph_replays_total", 'graph_mode="device"') == stats.replays


def test_a_failed_capture_is_counted_by_reason_in_metrics(tmp_path: Path) -> None:
    import httpx

    from paged_core.serve import ServeConfig, build_app

    from ..serve.serve_helpers import ServerThread

    path = save_tiny_model("qwen3", tmp_path)
    base = LLM(str(path), backend="reference", dtype="float32", kv_cache_memory="8MiB")
    llm = _device_llm(base, RecordingStrategy(fail_on="capture"))
    with ServerThread(build_app(llm.engine.core, ServeConfig(served_model_name="tiny"))) as server:
        body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        metrics = httpx.get(f"{server.url}/metrics", timeout=60).text
    label = 'reason="graph strategy capture raised RuntimeError"'
    assert _metric(metrics, "paged_graph_fallbacks_total", label) == 3, metrics  # the three decode steps
