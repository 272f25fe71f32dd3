"""Property: walking a compiled JSON schema by random allowed tokens always yields JSON that validates.

No model: each step fills the matcher's mask row and picks a uniformly random allowed token (SmolLM2's BPE
tokenizer, so tokens span several characters and the mask must cut them right), until the grammar ends. The
output must parse, validate against the schema (formats checked) and stay within the byte bound
:func:`.max_output_bytes` computes, the bound the engine-level property test relies on to end every output.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_core.structured import GrammarCompiler, StructuredOutputs, allocate_bitmask

from .schema_strategies import json_schemas, max_output_bytes

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def random_allowed(bitmask_row: torch.Tensor, rng: random.Random) -> int:
    """A uniformly random token id among those a bitmask row allows.

    numpy: ``helpers.allowed`` took ~15 ms a row on this 49k vocabulary, most of the walk's time.
    """
    bits = np.unpackbits(bitmask_row.numpy().view(np.uint8), bitorder="little")  # little-endian int32 words
    ids = np.flatnonzero(bits)
    return int(ids[rng.randrange(len(ids))])


def random_walk(compiler: GrammarCompiler, schema: dict[str, Any], rng: random.Random, max_steps: int) -> list[int]:
    """Tokens drawn uniformly from each step's allowed set until the grammar ends (at most ``max_steps``)."""
    matcher = compiler.compile(StructuredOutputs(json=schema)).matcher()
    bitmask = allocate_bitmask(1, compiler.vocab_size)
    tokens: list[int] = []
    for _ in range(max_steps):
        matcher.fill(bitmask, 0)
        token = random_allowed(bitmask[0], rng)
        assert matcher.accept([token])
        tokens.append(token)
        if matcher.is_terminated():
            return tokens
    raise AssertionError(f"no end after {max_steps} tokens for {json.dumps(schema)}")


@settings(
    max_examples=150,
    deadline=None,  # compiles and walks vary with the shared CI machine's load
    derandomize=True,  # CI must be stable: the same examples every run
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=json_schemas(max_depth=3, budget=200), seed=st.integers(0, 2**32 - 1))
def test_random_walks_validate(compiler: GrammarCompiler, tokenizer: Any, schema: dict[str, Any], seed: int) -> None:
    bound = max_output_bytes(schema)
    assert bound <= 200, (bound, schema)
    tokens = random_walk(compiler, schema, random.Random(seed), max_steps=bound + 2)
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    assert len(text.encode()) <= bound, (text, schema)
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)
