"""Property: every output ``LLM.generate`` writes under a generated JSON schema parses and validates.

The tiny model is random, so only the grammar's masks make its bytes JSON. Each example draws up to four
schemas (:func:`.json_schemas`: nested objects, arrays, enums, consts, strings, bounded numbers, anyOf/oneOf;
the constructs left out, and the llguidance limitations behind them, are listed in that module's docstring)
and generates them in one batch (so the masks are built for several grammars per step), sampled at
temperature 1.0 with a drawn seed (``n=2`` sometimes) or greedy. Every schema's output is at most 128 bytes
(one token each on the byte-level tokenizer), so each must end by the grammar (``stop``), not ``length``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_core.frontend.llm import LLM
from paged_core.sampling.params import SamplingParams
from paged_core.structured import StructuredOutputs

from ..structured.schema_strategies import json_schemas, max_output_bytes

BUDGET = 128
"""The longest output a drawn schema allows, in bytes (tokens, on this tokenizer)."""
MAX_TOKENS = BUDGET + 8  # the end token after the longest output, with room to spare
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path, tiny_loaded: Any) -> Iterator[LLM]:
    """One LLM for every example (its grammar compiler is built once), on the tiny random byte-level model."""
    with LLM(
        str(tiny_model_dir),
        backend=tiny_loaded.backend.name,
        graph_mode="eager",
        kv_cache_memory="4MiB",
        max_model_len=160,
        max_num_seqs=16,
    ) as model:
        yield model


def _request() -> st.SearchStrategy[tuple[dict[str, Any], SamplingParams]]:
    """A schema and its sampling: temperature 1.0 with a seed (n=1 or 2), or greedy."""

    def params(schema: dict[str, Any], seed: int, mode: str) -> tuple[dict[str, Any], SamplingParams]:
        fields: dict[str, Any] = {"max_tokens": MAX_TOKENS, "structured_outputs": StructuredOutputs(json=schema)}
        if mode == "greedy":
            fields["temperature"] = 0.0
        else:
            fields.update(temperature=1.0, seed=seed, n=2 if mode == "n2" else 1)
        return schema, SamplingParams(**fields)

    return st.builds(
        params,
        json_schemas(max_depth=3, budget=BUDGET),
        st.integers(0, 2**31 - 1),
        st.sampled_from(["sampled", "sampled", "n2", "greedy"]),
    )


@settings(
    max_examples=25,
    deadline=None,  # engine steps vary with the shared CI machine's load
    derandomize=True,  # CI must be stable: the same examples every run
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(requests=st.lists(_request(), min_size=1, max_size=4))
def test_every_output_validates(llm: LLM, requests: list[tuple[dict[str, Any], SamplingParams]]) -> None:
    outs = llm.generate(["hi"] * len(requests), [p for _, p in requests], use_tqdm=False)
    for (schema, params), out in zip(requests, outs, strict=True):
        assert out.error is None, (out.error, schema)
        assert len(out.outputs) == params.n
        for comp in out.outputs:
            context = (comp.text, json.dumps(schema))
            assert comp.finish_reason == "stop", context
            assert len(comp.token_ids) <= max_output_bytes(schema) + 1, context
            jsonschema.validate(json.loads(comp.text), schema, format_checker=FORMATS)
