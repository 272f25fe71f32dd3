"""Twenty-two JSON schemas of the kinds agents send: nested objects, bounded arrays, enums, numbers with
ranges, optional fields, ``additionalProperties: false``, unions and ``$ref``s.

Every string and array is bounded (``maxLength``, ``maxItems``), every number has a ``multipleOf`` (a power of
two, which ``jsonschema``'s float division checks exactly: 0.07 / 0.01 is not an integer there) and every object
is closed: each unbounded construct (a string, an array, a number's fraction, an open object's extra keys) lets a
sampled model write until ``max_tokens`` (the first runs did: 40 sampled fraction digits, 30 invented keys).
``uniqueItems`` is left out: llguidance refuses it (a 400 naming the schema).
"""

from __future__ import annotations

from typing import Any


def _s(n: int = 16) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
    }
    schema["additionalProperties"] = False
    return schema


ADDRESS = _obj({"street": _s(24), "city": _s(), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": _obj({"name": _s(), "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "person_optional_email": _obj(
        {
            "name": _s(),
            "email": {"type": "string", "maxLength": 32},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
        },
        required=["name"],
    ),
    "address_nested": _obj({"name": _s(), "address": ADDRESS}),
    "colors_bounded": _obj(
        {
            "colors": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue", "black"]},
                "minItems": 2,
                "maxItems": 3,
            }
        }
    ),
    "digits": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3, "maxItems": 5},
    "rating": _obj(
        {"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": _s(40), "recommend": {"type": "boolean"}}
    ),
    "temperature": _obj(
        {
            "celsius": {"type": "number", "minimum": -40, "maximum": 50, "multipleOf": 0.5},
            "unit": {"const": "C"},
            "city": _s(),
        }
    ),
    "probability": _obj(
        {"p": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125}, "label": {"enum": ["yes", "no"]}}
    ),
    "exclusive_range": _obj({"x": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}),
    "todo_list": _obj(
        {
            "todos": {
                "type": "array",
                "items": _obj({"title": _s(24), "done": {"type": "boolean"}}),
                "minItems": 1,
                "maxItems": 3,
            }
        }
    ),
    "sentiment": _obj(
        {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
        }
    ),
    "all_optional": _obj(
        {"id": {"type": "integer", "minimum": 1, "maximum": 1000}, "tag": _s(8), "note": _s(20)}, required=[]
    ),
    "nullable": _obj({"name": _s(), "nickname": {"anyOf": [_s(), {"type": "null"}]}}),
    "union_value": _obj(
        {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, _s(8), {"type": "boolean"}]}}
    ),
    "matrix": _obj(
        {
            "rows": {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "minItems": 2,
                "maxItems": 2,
            }
        }
    ),
    "event": _obj(
        {
            "title": _s(24),
            "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "attendees": {"type": "array", "items": _s(12), "maxItems": 3},
        },
        required=["title", "date"],
    ),
    "product": _obj(
        {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
            "price": {"type": "number", "minimum": 0.5, "maximum": 999, "multipleOf": 0.125},
            "in_stock": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["new", "sale", "eco"]}, "maxItems": 3},
        }
    ),
    "refs": {
        "$defs": {
            "point": _obj(
                {
                    "x": {"type": "integer", "minimum": -9, "maximum": 9},
                    "y": {"type": "integer", "minimum": -9, "maximum": 9},
                }
            )
        },
        **_obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}),
    },
    "search_args": _obj(
        {
            "query": _s(32),
            "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            "filters": _obj({"lang": {"enum": ["en", "fr", "de"]}, "safe": {"type": "boolean"}}, required=[]),
        },
        required=["query"],
    ),
    "deep_nesting": _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"type": "integer", "minimum": 0, "maximum": 9}})})})}),
    "answer_with_reason": _obj({"reasoning": _s(60), "answer": {"type": "integer", "minimum": 0, "maximum": 100}}),
    "enum_only": {"enum": ["alpha", "beta", 3, None, True]},
}
