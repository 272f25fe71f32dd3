"""The engine runs the example backend's own capture strategy (its counts prove it), output unchanged.

``--graph-mode compiled`` routes the uniform decode batches the example declares to its
``CompiledStrategy`` (static shapes per capture size) and everything else through the engine's dynamic
compiled step. torch.compile runs on dynamo's ``eager`` backend here: the same traced graphs, no code generation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_backend_example import ExampleBackend
from paged_core import LLM, SamplingParams

VOCAB = 256


def _tiny_model(directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        initializer_range=0.3,  # peaky logits: greedy choices are not decided by rounding
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)  # type: ignore[no-untyped-call]
    return directory


@pytest.fixture
def dynamo_eager(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every torch.compile (the engine's and the example strategy's) on dynamo's ``eager`` backend."""
    real: Callable[..., Any] = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("dynamo_eager")
def test_compiled_mode_replays_decodes_through_the_examples_strategy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paged_backend_example.recording import RecordingCompiledStrategy

    path = str(_tiny_model(tmp_path / "qwen3"))
    prompts = [[(7 * i + j) % (VOCAB - 3) + 3 for j in range(5 + 9 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    common: dict[str, Any] = {"backend": "example", "dtype": "float32", "kv_cache_memory": "8MiB"}
    eager = LLM(path, graph_mode="eager", **common)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]

    # One capture size keeps the test short: the three rows decode together, padded to 4.
    llm = LLM(path, graph_mode="compiled", capture_sizes=(4,), **common)
    backend = llm.engine.core.runner.backend
    assert isinstance(backend, ExampleBackend)
    assert backend.graph_calls.captures == Counter({4: 1})  # captured at start
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    stats = llm.engine.core.runner.executor.stats
    # 7 decode steps replayed by the strategy; the prefill ran in the engine's dynamic compiled step.
    assert backend.graph_calls.replays == Counter({4: 7}), backend.graph_calls
    assert stats.steps == stats.replays == 8 and stats.eager_steps == 0 and not stats.fallback_reasons, stats

    # A strategy whose replay raises: the size falls back to the dynamic step, counted; the output is unchanged.
    def broken(self: RecordingCompiledStrategy, key: object) -> torch.Tensor:
        raise RuntimeError("lost the compiled graph")

    monkeypatch.setattr(RecordingCompiledStrategy, "replay", broken)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert stats.fallback_reasons == {"graph strategy replay raised RuntimeError": 7}, stats
