"""Structured outputs end to end on the embedded model: JSON schemas (checked with ``jsonschema``), any JSON
object, a regex, a choice and a Lark grammar, greedy and sampled with a seed; greedy output under a constraint is
the same with and without n-gram speculation."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from paged_core import LLM, SamplingParams
from paged_core.structured import StructuredOutputs

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        },
        "required": ["ok", "tags"],
        "additionalProperties": False,
    },
]
REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
CHOICES = ["Paris", "London", "Berlin", "Madrid"]
LARK = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/\n'
LARK_LANGUAGE = r"\([0-9]{1,3}(,[0-9]{1,3})*\)"


def _params(spec: StructuredOutputs, temperature: float = 0.0, max_tokens: int = 40) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=11, max_tokens=max_tokens, structured_outputs=spec)


@pytest.fixture(scope="module")
def llm(smol_base: LLM) -> LLM:
    """The shared embedded model on its own engine (its own grammar compiler)."""
    return smol_base.reconfigured()


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
def test_every_kind_of_constraint_fits(llm: LLM, temperature: float) -> None:
    cases: list[tuple[str, StructuredOutputs]] = [
        ("A person as JSON:", StructuredOutputs(json=schema)) for schema in SCHEMAS
    ] + [
        ("A JSON object:", StructuredOutputs(json_object=True)),
        ("The date of the moon landing:", StructuredOutputs(regex=REGEX)),
        ("The capital of France is", StructuredOutputs(choice=CHOICES)),
        ("A tuple of small numbers:", StructuredOutputs(grammar=LARK)),
    ]
    outs = llm.generate(
        [p for p, _ in cases], [_params(s, temperature, max_tokens=48) for _, s in cases], use_tqdm=False
    )
    for (_, spec), out in zip(cases, outs, strict=True):
        comp = out.outputs[0]
        text = comp.text
        if spec.json_object and temperature > 0 and comp.finish_reason == "length":
            # Any object is unbounded: a sampled one may run to max_tokens (this seed's does), cut mid-object.
            assert len(comp.token_ids) == 48 and text.startswith("{"), text
            continue
        assert comp.finish_reason == "stop", (spec.kind, comp.text)
        if spec.json is not None:
            jsonschema.validate(json.loads(text), json.loads(spec.json))  # the spec holds the schema as JSON text
        elif spec.json_object:
            assert isinstance(json.loads(text), dict), text
        elif spec.regex is not None:
            assert re.fullmatch(REGEX, text), text
        elif spec.choice is not None:
            assert text in CHOICES, text
        else:
            assert re.fullmatch(LARK_LANGUAGE, text), text
    stats = llm.engine.core.grammars.stats
    assert len(stats.compile_s) >= len(cases) and stats.steps > 0


def test_greedy_constrained_output_is_the_same_with_ngram_speculation(llm: LLM) -> None:
    prompts = ["A person as JSON:", "List the colors as JSON:", "The date of the moon landing:"]
    params = [
        _params(StructuredOutputs(json=SCHEMAS[0])),
        _params(StructuredOutputs(json=SCHEMAS[1])),
        _params(StructuredOutputs(regex=REGEX)),
    ]
    plain = llm.generate(prompts, params, use_tqdm=False)
    spec = llm.reconfigured(speculative="ngram", num_speculative_tokens=4)
    drafted = spec.generate(prompts, params, use_tqdm=False)
    for a, b in zip(plain, drafted, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids, (a.outputs[0].text, b.outputs[0].text)
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason == "stop"
    assert spec.engine.core.spec_stats.verify_rows > 0  # drafts did run against the grammar


def test_min_tokens_and_ignore_eos_yield_to_the_grammars_end(llm: LLM) -> None:
    """``min_tokens`` holds the end off only while the grammar can go on; a grammar that has ended ends the output
    (``stop``) even below ``min_tokens`` or under ``ignore_eos``, never a token outside it."""
    digits = StructuredOutputs(regex="[0-9]+")
    cases = [
        SamplingParams(max_tokens=20, min_tokens=8, structured_outputs=StructuredOutputs(choice=["yes", "no"])),
        SamplingParams(max_tokens=12, min_tokens=6, structured_outputs=digits),
        SamplingParams(max_tokens=20, ignore_eos=True, structured_outputs=StructuredOutputs(choice=["a", "b"])),
    ]
    yes_no, number, ab = (o.outputs[0] for o in llm.generate(["Is it?", "A number:", "Pick"], cases, use_tqdm=False))
    assert yes_no.text in ("yes", "no") and yes_no.finish_reason == "stop"
    assert re.fullmatch("[0-9]+", number.text) and len(number.token_ids) >= 6
    assert ab.text in ("a", "b") and ab.finish_reason == "stop"
