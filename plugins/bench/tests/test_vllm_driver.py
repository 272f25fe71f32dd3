"""The vLLM driver script's own logic, with a fake engine in place of vLLM's ``LLMEngine``.

The driver runs in vLLM's environment, where paged is not installed, so it is
loaded here by file path, and must import nothing from paged.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import paged_bench

DRIVER = Path(paged_bench.__file__).with_name("vllm_driver.py")


def load_driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_driver_under_test", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


driver = load_driver()


def test_driver_imports_nothing_of_paged_and_vllm_only_lazily() -> None:
    tree = ast.parse(DRIVER.read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.startswith(("paged", "vllm"))]
    every = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not any((getattr(n, "module", None) or "").startswith("paged") for n in every)
    assert not any(a.name.startswith("paged") for n in every if isinstance(n, ast.Import) for a in n.names)


class Clock:
    """Advances one second per reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@dataclass
class FakeEngine:
    """Prefills one request per step, then decodes every prefilled request one token a step (DELTA outputs)."""

    extra_tokens: int = 0
    cached: int = 0
    added: list[tuple[str, list[int], int]] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)
    prefilled: list[str] = field(default_factory=list)
    step_calls: int = 0

    def add_request(self, rid: str, prompt: dict[str, Any], max_tokens: int) -> None:
        self.added.append((rid, prompt["prompt_token_ids"], max_tokens))
        self.left[rid] = max_tokens + self.extra_tokens

    def has_unfinished_requests(self) -> bool:
        return any(v > 0 for v in self.left.values())

    def step(self) -> list[Any]:
        self.step_calls += 1
        waiting = [rid for rid, _, _ in self.added if rid not in self.prefilled]
        active = [r for r in self.prefilled if self.left[r] > 0]
        if waiting:
            self.prefilled.append(waiting[0])
            active.append(waiting[0])
        outs = []
        for rid in active:
            self.left[rid] -= 1
            outs.append(
                SimpleNamespace(
                    request_id=rid,
                    outputs=[SimpleNamespace(token_ids=[7])],
                    finished=self.left[rid] == 0,
                    num_cached_tokens=self.cached,
                )
            )
        return outs


def test_run_requests_times_every_first_token() -> None:
    engine = FakeEngine(cached=2)
    reqs = [([1, 2, 3], 3), ([4, 5], 2), ([6], 2)]
    out = driver.run_requests(engine, reqs, lambda n: n, clock=Clock())
    assert [a[0] for a in engine.added] == ["r0", "r1", "r2"]
    assert [a[2] for a in engine.added] == [3, 2, 2]
    # start is clock reading 1; step k's outputs are read at reading k + 1.
    assert out["ttft"] == [1.0, 2.0, 3.0]
    assert out["per_request_output_tokens"] == [3, 2, 2]
    assert (out["num_requests"], out["prompt_tokens"], out["output_tokens"]) == (3, 6, 7)
    assert out["steps"] == 4 and out["cached_prompt_tokens"] == 6
    assert out["seconds"] == 5.0
    # After the last first token (t=3) only r2's last token comes, one second later.
    assert out["decode_tok_s"] == pytest.approx(1.0)


def test_run_requests_refuses_extra_tokens() -> None:
    with pytest.raises(RuntimeError, match=r"did not produce exactly max_tokens tokens \(request 0: 3, asked for 2\)"):
        driver.run_requests(FakeEngine(extra_tokens=1), [([1], 2), ([2], 2)], lambda n: n, clock=Clock())


def test_run_requests_stops_when_the_engine_does() -> None:
    engine = FakeEngine()
    engine.has_unfinished_requests = lambda: False  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="no unfinished requests with 1 of 1 not finished"):
        driver.run_requests(engine, [([1], 2)], lambda n: n, clock=Clock())


def test_decode_rate() -> None:
    assert driver.decode_rate([(1.0, 4), (2.0, 3), (4.0, 3)], 2.0) == pytest.approx(1.5)
    assert driver.decode_rate([(1.0, 4)], 2.0) is None


def test_load_spec_checks_requests(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    good = {"model": "m", "engine": {}, "requests": [{"prompt_token_ids": [1, 2], "max_tokens": 3}]}
    path.write_text(json.dumps(good))
    assert driver.load_spec(str(path))["requests"][0]["max_tokens"] == 3
    for bad, message in [
        ({**good, "requests": []}, "no requests"),
        ({k: v for k, v in good.items() if k != "model"}, "missing 'model'"),
        ({**good, "requests": [{"prompt_token_ids": [], "max_tokens": 3}]}, "request 0: prompt_token_ids"),
        ({**good, "requests": [{"prompt_token_ids": [1], "max_tokens": 0}]}, "request 0: max_tokens"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            driver.load_spec(str(path))


def test_usage() -> None:
    assert driver.main([]) == 2
