"""Every constraint kind compiles and a greedy walk under its masks writes text that validates; bad ones fail alone."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import jsonschema
import pytest
import torch

from paged_core.structured import (
    ConstraintCompileError,
    ConstraintTimeoutError,
    GrammarCompiler,
    StructuredOutputs,
    allocate_bitmask,
)

from .helpers import PADDED_VOCAB, allowed, greedy_walk

_CLOSED = {"type": "object", "additionalProperties": False}
SCHEMAS: list[dict[str, Any]] = [
    {
        **_CLOSED,
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 18}},
        "required": ["name", "age"],
    },
    {**_CLOSED, "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}}},
    {
        **_CLOSED,
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "maxItems": 3},
            "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
        },
        "required": ["tags", "score"],
    },
    {
        **_CLOSED,
        "properties": {"user": {**_CLOSED, "properties": {"id": {"type": "integer", "maximum": 99}}}},
        "required": ["user"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_json_schema_walk_validates(compiler: GrammarCompiler, tokenizer: Any, schema: dict[str, Any]) -> None:
    tokens = greedy_walk(compiler, StructuredOutputs(json=schema))
    assert all(t < len(tokenizer) for t in tokens), "a padded id past the tokenizer was allowed"
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    jsonschema.validate(json.loads(text), schema)


def test_regex_walk_fullmatches(compiler: GrammarCompiler, tokenizer: Any) -> None:
    regex = r"[A-Z]{2}-\d{3}(-[a-z]{1,4})?"
    text = tokenizer.decode(greedy_walk(compiler, StructuredOutputs(regex=regex)), skip_special_tokens=True)
    assert re.fullmatch(regex, text), text


def test_choice_walk_is_a_member(compiler: GrammarCompiler, tokenizer: Any) -> None:
    choices = ['say "hi"', "back\\slash", "two\nlines", "café ✓", "plain"]
    for n in range(1, len(choices) + 1):  # each prefix of the list: the walk must land on a member every time
        spec = StructuredOutputs(choice=choices[:n])
        assert tokenizer.decode(greedy_walk(compiler, spec), skip_special_tokens=True) in choices[:n]


def test_grammar_walk_is_in_its_language(compiler: GrammarCompiler, tokenizer: Any) -> None:
    grammar = (
        'start: item | item "," item | item "," item "," item\n'
        'item: KEY "=" NUM\nKEY: /[a-c]{1,3}/\nNUM: /[0-9]{1,2}/\n'
    )
    text = tokenizer.decode(greedy_walk(compiler, StructuredOutputs(grammar=grammar)), skip_special_tokens=True)
    assert re.fullmatch(r"[a-c]{1,3}=[0-9]{1,2}(,[a-c]{1,3}=[0-9]{1,2}){0,2}", text), text


def test_json_object_takes_objects_only(compiler: GrammarCompiler, tokenizer: Any) -> None:
    compiled = compiler.compile(StructuredOutputs(json_object=True))
    matcher = compiled.matcher()
    assert matcher.accept(tokenizer.encode('{"a": [1, 2], "b": {"c": null}}'))
    assert matcher.is_accepting()
    assert not compiled.matcher().accept(tokenizer.encode("[1, 2]"))


def test_padded_ids_are_never_allowed(compiler: GrammarCompiler, tokenizer: Any) -> None:
    matcher = compiler.compile(StructuredOutputs(json_object=True)).matcher()
    assert matcher.accept(tokenizer.encode('{"k": "'))  # inside a string: nearly every token is allowed
    bitmask = allocate_bitmask(1, PADDED_VOCAB)
    matcher.fill(bitmask, 0)
    ids = allowed(bitmask[0])
    assert len(ids) > 40_000 and int(ids[-1]) < len(tokenizer)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (StructuredOutputs(regex="(unclosed"), "regex"),
        (StructuredOutputs(grammar="start: undefined_rule"), "grammar"),
        (StructuredOutputs(grammar="this is not lark"), "grammar"),
        (StructuredOutputs(json={"type": "nonsense"}), "json"),
        (StructuredOutputs(json={"type": "string", "pattern": "(x"}), "json"),
    ],
)
def test_invalid_constraints_fail_naming_the_field(
    compiler: GrammarCompiler, spec: StructuredOutputs, field: str
) -> None:
    with pytest.raises(ConstraintCompileError) as info:
        compiler.submit(spec).result()
    assert info.value.field == field and str(info.value).startswith(f"structured_outputs.{field}:")


def _big_schema() -> dict[str, Any]:
    """~64,000 characters (just under the spec's bound): 300 objects with patterned strings and bounded arrays."""
    item = {"type": "array", "items": {"type": "integer"}, "maxItems": 5}
    props = {
        f"field_{i}": {
            **_CLOSED,
            "properties": {"a": {"type": "string", "pattern": f"[a-z]{{{i % 7 + 1},{i % 50 + 20}}}"}, "b": item},
        }
        for i in range(300)
    }
    return {**_CLOSED, "properties": props}


def test_a_slow_compile_times_out_alone(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile held past the bound fails alone; a quick one submitted beside it compiles (a wide margin for load)."""
    with GrammarCompiler(tokenizer, timeout_s=0.3, max_workers=2) as tight:
        real = tight._compile

        def compile_held_for_json(spec: StructuredOutputs) -> Any:
            if spec.kind == "json":
                time.sleep(1.5)
            return real(spec)

        monkeypatch.setattr(tight, "_compile", compile_held_for_json)
        slow = tight.submit(StructuredOutputs(json=_big_schema()))
        quick = tight.submit(StructuredOutputs(regex="[0-9]{3}"))
        assert quick.result().field == "regex"
        with pytest.raises(ConstraintTimeoutError, match=r"within 0\.3 s") as info:
            slow.result()
        assert info.value.field == "json"


def test_a_vocab_below_the_tokenizers_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="below the tokenizer"):
        GrammarCompiler(tokenizer, vocab_size=1000)


def test_a_repeated_constraint_compiles_once(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same constraint, one compile: those submitted while it runs share it, later ones hit the cache; a failure is
    not kept, and a cancelled waiter leaves the compile to the others."""
    with GrammarCompiler(tokenizer, max_workers=2) as compiler:
        real = compiler._compile
        started: list[str] = []

        def counted(spec: StructuredOutputs) -> Any:
            started.append(spec.kind)
            time.sleep(0.2)  # long enough that the next submits find it running
            return real(spec)

        monkeypatch.setattr(compiler, "_compile", counted)
        spec = StructuredOutputs(json=SCHEMAS[0])
        first, cancelled, second = (compiler.submit(spec) for _ in range(3))
        assert cancelled.cancel()
        a, b = first.result(), second.result()
        assert started == ["json"] and not a.cached
        again = compiler.submit(StructuredOutputs(json=json.dumps(SCHEMAS[0]))).result()  # equal spec, from its text
        assert again.cached and started == ["json"] and again.compile_s == a.compile_s
        one, other = a.matcher(), again.matcher()  # each hands out independent matchers
        start = allocate_bitmask(1, compiler.vocab_size)
        other.fill(start, 0)
        assert one.accept([int(allowed(start[0])[0])])
        after = allocate_bitmask(1, compiler.vocab_size)
        other.fill(after, 0)
        assert torch.equal(after, start) and b.field == "json"
        bad = StructuredOutputs(regex="(")
        for _ in range(2):
            with pytest.raises(ConstraintCompileError):
                compiler.compile(bad)
        assert started == ["json", "regex", "regex"]
