"""StructuredOutputs: exactly one constraint, checked and normalised when built, and it travels by msgspec."""

from __future__ import annotations

import msgspec
import pytest

from paged_core.errors import RequestRejectedError
from paged_core.structured import ConstraintError, StructuredOutputs
from paged_core.structured.spec import MAX_CHOICES, MAX_CONSTRAINT_CHARS


def test_each_kind_is_one_field() -> None:
    assert StructuredOutputs(json={"type": "object"}).kind == "json"
    assert StructuredOutputs(json_object=True).kind == "json_object"
    assert StructuredOutputs(regex="a+").kind == "regex"
    assert StructuredOutputs(choice=["a", "b"]).kind == "choice"
    assert StructuredOutputs(grammar='start: "x"').kind == "grammar"


def test_json_is_normalised_to_text_with_key_order_kept() -> None:
    spec = StructuredOutputs(json={"type": "object", "properties": {"z": {}, "a": {}}})
    assert spec.json == '{"type": "object", "properties": {"z": {}, "a": {}}}'
    assert list((spec.schema or {})["properties"]) == ["z", "a"]
    assert StructuredOutputs(choice=["a"]).choice == ("a",)


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({}, "json", "none is set"),
        ({"json": {"type": "object"}, "regex": "a"}, "regex", "json and regex"),
        ({"json_object": True, "choice": ["a"]}, "choice", "json_object and choice"),
        ({"json": "{not json"}, "json", "not valid JSON"),
        ({"json": "[1]"}, "json", "must be a JSON object"),
        ({"json": 3}, "json", "a dict or its JSON text"),
        ({"json": {"type": {1, 2}}}, "json", "not JSON-serialisable"),
        ({"json": {"enum": ["x" * MAX_CONSTRAINT_CHARS]}}, "json", f"at most {MAX_CONSTRAINT_CHARS}"),
        ({"regex": ""}, "regex", "non-empty str"),
        ({"regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}, "regex", f"at most {MAX_CONSTRAINT_CHARS}"),
        ({"grammar": 7}, "grammar", "non-empty str"),
        ({"choice": "ab"}, "choice", "list of strings"),
        ({"choice": []}, "choice", "1 to"),
        ({"choice": ["a"] * (MAX_CHOICES + 1)}, "choice", "1 to"),
        ({"choice": ["a", ""]}, "choice", "non-empty str"),
        ({"choice": ["x" * 40_000, "y" * 40_000]}, "choice", "characters in all"),
        ({"json_object": 1}, "json_object", "a bool"),
    ],
)
def test_bad_specs_name_the_field(kwargs: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ConstraintError, match=words) as info:
        StructuredOutputs(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert str(info.value).startswith(f"structured_outputs.{field}:")
    assert isinstance(info.value, RequestRejectedError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputs(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
        StructuredOutputs(json_object=True),
        StructuredOutputs(choice=["yes", "no"]),
        StructuredOutputs(grammar='start: "x"'),
    ],
)
def test_msgpack_round_trip(spec: StructuredOutputs) -> None:
    """The way SamplingParams crosses to a core process: msgpack, decoded by type (``__post_init__`` again)."""
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=StructuredOutputs)
    assert back == spec


def test_decoding_a_bad_one_fails() -> None:
    with pytest.raises((ConstraintError, msgspec.ValidationError)):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"regex": "a", "choice": ["b"]}), type=StructuredOutputs)
