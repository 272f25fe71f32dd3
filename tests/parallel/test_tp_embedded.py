"""The embedded SmolLM2-135M (9 heads, 3 KV heads): tensor parallel 2 refused by name, 3 gives 1's greedy text."""

from __future__ import annotations

from typing import Any

import pytest

from paged_core import LLM, SamplingParams
from paged_core.errors import UnsupportedConfigError

from .tp_helpers import worker_pids

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def test_tensor_parallel_2_is_refused_before_any_weight_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import paged_core.loading.build as build

    def no_weights(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("weights were loaded before the size was checked")

    monkeypatch.setattr(build, "load_model", no_weights)
    with pytest.raises(UnsupportedConfigError) as info:
        LLM(tensor_parallel_size=2)
    text = str(info.value)
    assert "tensor_parallel_size=2" in text and "9 attention heads and 3 KV heads" in text
    assert "sizes that work: 1, 3" in text
    assert worker_pids() == []  # refused before any worker started


def test_tensor_parallel_over_packed_weights_is_refused_with_the_way_out() -> None:
    with pytest.raises(
        UnsupportedConfigError,
        match=r"tensor parallelism over packed \(quantized\) weights is not "
        r"supported yet \(quantization='auto' on a GGUF\); pass --quantization none",
    ):
        LLM(tensor_parallel_size=3)
    assert worker_pids() == []


@pytest.mark.manual  # three ranks each dequantize the whole GGUF (~1.2 GB, about a minute each on 2 cores)
def test_tensor_parallel_3_gives_the_same_greedy_text() -> None:
    engine = {"dtype": "float32", "kv_cache_memory": "128MiB", "backend": "reference", "quantization": "none"}
    with LLM(**engine) as one:
        want = [o.outputs[0].text for o in one.generate(PROMPTS, GREEDY, use_tqdm=False)]
    with LLM(tensor_parallel_size=3, distributed_timeout=120, **engine) as three:
        got = [o.outputs[0].text for o in three.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == want
    assert worker_pids() == []
