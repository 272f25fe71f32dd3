"""``use_beam_search`` on ``/v1/completions`` (vLLM's extra): the beams the engine finds, best first; refusals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .serve_helpers import API_KEY, MODEL_NAME, MODES, ServerThread, serve

AUTH = {"Authorization": f"Bearer {API_KEY}"}
BEAM = {
    "model": MODEL_NAME,
    "prompt": "The river",
    "max_tokens": 4,
    "n": 3,
    "use_beam_search": True,
    "ignore_eos": True,
}


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest, loaded: Any) -> Iterator[ServerThread]:
    from paged_core.serve import ServeConfig

    config = ServeConfig(served_model_name=MODEL_NAME, api_key=API_KEY, max_n=8)
    with serve(loaded, config, mode=request.param, max_num_seqs=4) as s:
        yield s


def _post(server: ServerThread, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60)


def test_beams_come_back_best_first_as_the_engine_finds_them(server: ServerThread, loaded: Any) -> None:
    from paged_core import LLM, LLMEngine

    r = _post(server, {**BEAM, "length_penalty": 0.5})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    # The same search offline, on the same weights (the server may run its core in another process).
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(_config(loaded), loaded)
    want = llm.beam_search("The river", 3, max_tokens=4, length_penalty=0.5, ignore_eos=True, use_tqdm=False)[0]
    assert [c["text"] for c in choices] == [s.text for s in want.sequences]
    assert all(c["finish_reason"] == "length" for c in choices)
    assert r.json()["usage"]["completion_tokens"] == 12


def _config(loaded: Any) -> Any:
    from paged_core.engine_config import EngineConfig

    return EngineConfig.of(model=str(loaded.source.directory), kv_cache_memory="2MiB", max_num_seqs=4)


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"stream": True}, "stream", "stream=true is not supported with use_beam_search"),
        ({"temperature": 0.8}, "temperature", "set temperature 0"),
        ({"top_p": 0.5}, "top_p", "leave top_p at 1"),
        ({"seed": 3}, "seed", "leave seed unset"),
        ({"n": 5}, "n", "n (the beam width) must be an int in [1, 4]"),
        ({"best_of": 4}, "best_of", "only best_of == n"),
        ({"length_penalty": 1.5, "use_beam_search": False}, "length_penalty", "set use_beam_search true"),
        ({"early_stopping": "sometimes"}, "early_stopping", None),
    ],
)
def test_what_beam_search_cannot_honour_is_a_400_naming_the_field(
    server: ServerThread, change: dict[str, Any], param: str, words: str | None
) -> None:
    r = _post(server, {**BEAM, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    if words is not None:
        assert words in error["message"], error
    assert _post(server, BEAM).status_code == 200  # and the server serves on
