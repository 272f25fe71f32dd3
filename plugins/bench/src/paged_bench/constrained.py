"""The constrained variant of ``throughput``: the same requests, each with one of eight bounded JSON schemas.

The schemas are what agents ask for (a person, a product, an event, a tool call, a sentiment label, an
address, an order, a search query): closed objects (``additionalProperties: false``), every string and
array bounded, enums and ranged numbers with a ``multipleOf`` (a number's fraction is otherwise unbounded: a model
sampling digits wrote 200 of them), so each grammar ends within the workload's output lengths.
Request ``i`` gets schema ``i % 8``, so any prefix of the workload spreads over all of them.
"""

from __future__ import annotations

from typing import Any

CONSTRAINED = "paged-constrained"
"""The constrained run's name in the report (our engine, same weights and cache, every request constrained)."""
SAME_LENGTHS = "paged-same-lengths"
"""Unconstrained again, each request capped at the length its constrained run produced: the same tokens, so
the time difference is what constraining cost (masks, compiles, accepting tokens)."""


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


def _str(max_length: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length}


SCHEMAS: tuple[dict[str, Any], ...] = (
    _obj({"name": _str(24), "age": {"type": "integer", "minimum": 0, "maximum": 120}, "email": _str(32)}),
    _obj(
        {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "price": {"type": "number", "minimum": 0, "maximum": 10000, "multipleOf": 0.01},
            "in_stock": {"type": "boolean"},
            "tags": {"type": "array", "items": _str(12), "maxItems": 3},
        }
    ),
    _obj(
        {
            "title": _str(32),
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "month": {"enum": ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]},
            "attendees": {"type": "array", "items": _str(16), "minItems": 1, "maxItems": 4},
        }
    ),
    _obj(
        {
            "tool": {"enum": ["search", "calculator", "weather", "calendar"]},
            "arguments": _obj({"query": _str(40), "limit": {"type": "integer", "minimum": 1, "maximum": 20}}),
        }
    ),
    _obj(
        {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.05},
        }
    ),
    _obj(
        {"street": _str(32), "city": _str(20), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": _str(2)},
        required=["street", "city", "country"],
    ),
    _obj(
        {
            "order_id": {"type": "integer", "minimum": 1, "maximum": 999999},
            "items": {
                "type": "array",
                "items": _obj({"sku": _str(8), "qty": {"type": "integer", "minimum": 1, "maximum": 9}}),
                "minItems": 1,
                "maxItems": 3,
            },
            "express": {"type": "boolean"},
        }
    ),
    _obj(
        {
            "query": _str(48),
            "filters": _obj(
                {
                    "lang": {"enum": ["en", "fr", "de", "es"]},
                    "after": {"type": "integer", "minimum": 1990, "maximum": 2030},
                },
                required=["lang"],
            ),
        }
    ),
)
"""Eight schemas; request ``i`` is constrained by ``SCHEMAS[i % 8]``."""


def schema_for(index: int) -> dict[str, Any]:
    """The schema of the workload's request ``index``."""
    return SCHEMAS[index % len(SCHEMAS)]
