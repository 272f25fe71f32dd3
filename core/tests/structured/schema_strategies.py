"""Hypothesis strategies for JSON schemas that llguidance compiles and whose outputs have a known length bound.

:func:`json_schemas` draws nested objects, arrays, enums, consts, strings (lengths, anchored patterns, formats),
bounded integers and numbers, booleans, null, nullable types, ``anyOf`` and ``oneOf``, each within a byte
budget: :func:`max_output_bytes` bounds the UTF-8 length of any output the compact-JSON grammar allows, so a
random model always ends within ``max_tokens`` of a byte-level tokenizer.

Left out, and why (found by walking llguidance 1.9's grammars):

- ``uniqueItems``: llguidance refuses it ("Unimplemented keys");
- ``additionalProperties`` absent with optional properties: any extra key and value may follow, so the output
  is unbounded (the strategy only omits it when every property is required and ``maxProperties`` pins the
  count, the one case llguidance bounds);
- unanchored ``pattern`` and ``format`` email/hostname/time/date-time: unbounded (a pattern is a search, and
  those formats allow arbitrarily long parts);
- integers or numbers without both bounds, and numbers without ``multipleOf``: unbounded digits;
- ``multipleOf`` that binary floats cannot hold (0.1): jsonschema checks it by float division and refuses
  exact multiples such as 0.3;
- enum/const floats with 17 significant digits: llguidance reads the schema's numbers one ULP off for some
  (``{"const": 36.758720024256036}`` only admits ``36.75872002425603``, a different double), so the strategy
  draws floats of at most 12 significant digits; and huge ones: llguidance writes 1e300 in full, an integer
  that JSON parses to ``10**300`` (equal as a double, unequal under Python's exact comparison);
- a number whose ``minimum == maximum`` is a non-integer multiple of a finer ``multipleOf``
  (``{"type": "number", "multipleOf": 0.25, "minimum": 1.5, "maximum": 1.5}``): llguidance refuses to compile
  it ("NoExtensionBias"), so number ranges always hold two multiples;
- ``oneOf`` over overlapping branches: llguidance only compiles a ``oneOf`` it can prove disjoint.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

from hypothesis import strategies as st

Schema = dict[str, Any]

MAX_CHAR_BYTES = 6
"""The most bytes one string character takes in the grammar: a ``\\uXXXX`` escape (surrogate pairs are refused)."""

PATTERNS: dict[str, int] = {
    r"^[a-z]{1,4}$": 4,
    r"^[0-9]{3}-[0-9]{2}$": 6,
    r"^(yes|no|maybe)$": 5,
    r"^[A-F0-9]{2,6}$": 6,
    r"^\d{1,3}(\.\d{1,2})?$": 6,
    r"^é{1,2}[ü ]?$": 3,
    r"^\w{2}$": 2,
}
"""Anchored patterns with bounded quantifiers, each with the most characters it matches."""

FORMATS: dict[str, int] = {"date": 10, "uuid": 36, "ipv4": 15}
"""Formats llguidance enforces with bounded grammars (and jsonschema's format checker checks), with max lengths."""

MULTIPLES = (Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1), Fraction(5, 2))
"""``multipleOf`` values binary floats hold exactly."""

NAME_CHARS = 'abxyz_09 "\\é字😀\x01'
"""Property-name characters, with a quote, a backslash, a control character and multi-byte ones to escape."""


def _literal_bytes(value: Any) -> int:
    """The length of the compact JSON llguidance writes for an enum or const value (floats in full decimals)."""
    if isinstance(value, float) and not value.is_integer():
        return len(format(value, ".17f").rstrip("0")) + 1
    if isinstance(value, float):
        return len(str(int(value))) + 2
    if isinstance(value, list):
        return 2 + sum(_literal_bytes(v) + 2 for v in value)
    if isinstance(value, dict):
        return 2 + sum(_key_bytes(k) + 2 + _literal_bytes(v) + 2 for k, v in value.items())
    return len(json.dumps(value, ensure_ascii=False).encode())


def _key_bytes(name: str) -> int:
    return len(json.dumps(name, ensure_ascii=False).encode())


def _digits(value: float) -> int:
    """Characters of the integer part of ``value``, sign included."""
    return len(str(int(abs(value)))) + (1 if value < 0 else 0)


def max_output_bytes(schema: Schema) -> int:
    """The longest UTF-8 output (compact JSON, ``", "`` and ``": "`` separators) the schema's grammar allows."""
    if "const" in schema:
        return _literal_bytes(schema["const"])
    if "enum" in schema:
        return max(_literal_bytes(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return max(max_output_bytes(s) for s in schema[key])
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return max(_type_bytes(schema, kind) for kind in kinds)


def _type_bytes(schema: Schema, kind: str) -> int:
    if kind == "null":
        return 4
    if kind == "boolean":
        return 5
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        digits = max(_digits(low), _digits(high))
        if kind == "integer":
            return digits
        step, decimals = Fraction(schema["multipleOf"]), 0
        while (step * 10**decimals).denominator != 1:
            decimals += 1
        return digits + 1 + max(decimals, 1)  # room for a written "1.0" as well
    if kind == "string":
        if "pattern" in schema:
            return 2 + MAX_CHAR_BYTES * PATTERNS[schema["pattern"]]
        if "format" in schema:
            return 2 + FORMATS[schema["format"]]
        return 2 + MAX_CHAR_BYTES * int(schema["maxLength"])
    if kind == "array":
        n = int(schema["maxItems"])
        return 2 + n * max_output_bytes(schema["items"]) + 2 * max(n - 1, 0)
    assert kind == "object", kind
    props = schema["properties"]
    body = sum(_key_bytes(k) + 2 + max_output_bytes(v) for k, v in props.items())
    return 2 + body + 2 * max(len(props) - 1, 0)


def _finite_floats() -> st.SearchStrategy[float]:
    """Floats with at most 12 significant digits, between 1e-6 and 1e9 in size (or 0)."""
    return st.one_of(
        st.integers(-(10**12), 10**12).map(lambda i: i / 1000),
        st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(-999, 999), st.integers(-6, 6)),
    )


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.text(max_size=3),
        st.integers(-1000, 1000),
        _finite_floats(),
        st.booleans(),
        st.none(),
    )


def _values(budget: int) -> st.SearchStrategy[Any]:
    """Enum and const values that fit ``budget`` bytes: scalars, and (given room) small lists and objects of them."""
    if budget < 24:
        return _scalars().filter(lambda v: _fits([v], budget))
    return st.one_of(
        _scalars(),
        st.lists(_scalars(), max_size=2),
        st.dictionaries(st.text(NAME_CHARS, min_size=1, max_size=3), _scalars(), max_size=2),
    ).filter(lambda v: _fits([v], budget))


@st.composite
def _integer(draw: st.DrawFn, budget: int) -> Schema:
    width = min(budget, 5)
    top = 10 ** (width - 1) - 1  # a negative bound spends a character on its sign
    low = draw(st.integers(-top, top))
    high = draw(st.integers(low, top))
    schema: Schema = {"type": "integer"}
    lo_excl = high - low >= 2 and draw(st.booleans())
    hi_excl = high - low >= 2 and draw(st.booleans())
    schema["exclusiveMinimum" if lo_excl else "minimum"] = low
    schema["exclusiveMaximum" if hi_excl else "maximum"] = high
    first, last = low + lo_excl, high - hi_excl
    if draw(st.booleans()):  # a fractional bound: the integers strictly inside it
        schema.pop("minimum", None)
        schema.pop("exclusiveMinimum", None)
        schema["minimum"] = first - 0.5
    step = draw(st.sampled_from([None, 2, 3, 5]))
    if step is not None and any(v % step == 0 for v in range(first, last + 1)):
        schema["multipleOf"] = step
    return schema


@st.composite
def _number(draw: st.DrawFn, budget: int) -> Schema:
    step = draw(st.sampled_from(MULTIPLES))
    decimals = 0 if step.denominator == 1 else int(math.log2(step.denominator))
    width = max(1, min(budget - 2 - decimals, 4))
    top = 10 ** (width - 1) - 1
    low = draw(st.integers(-top * 4, top * 4)) / 4
    high = draw(st.integers(math.ceil(low * 4), top * 4)) / 4
    lo_excl, hi_excl = draw(st.booleans()), draw(st.booleans())
    first = math.floor(Fraction(low) / step) + 1 if lo_excl else math.ceil(Fraction(low) / step)
    last = math.ceil(Fraction(high) / step) - 1 if hi_excl else math.floor(Fraction(high) / step)
    if first >= last:  # fewer than two multiples inside: widen to two (see the module doc on minimum == maximum)
        low, high, lo_excl, hi_excl = float(step * first), float(step * (first + 1)), False, False
    schema: Schema = {"type": "number", "multipleOf": float(step)}
    schema["exclusiveMinimum" if lo_excl else "minimum"] = low
    schema["exclusiveMaximum" if hi_excl else "maximum"] = high
    return schema


@st.composite
def _string(draw: st.DrawFn, budget: int) -> Schema:
    room = (budget - 2) // MAX_CHAR_BYTES
    choices = (
        ["length"] + [p for p, n in PATTERNS.items() if n <= room] + [f for f, n in FORMATS.items() if n + 2 <= budget]
    )
    pick = draw(st.sampled_from(choices))
    if pick in PATTERNS:
        return {"type": "string", "pattern": pick}
    if pick in FORMATS:
        return {"type": "string", "format": pick}
    high = draw(st.integers(0, min(room, 4)))
    return {"type": "string", "minLength": draw(st.integers(0, high)), "maxLength": high}


def _fits(values: list[Any], budget: int) -> bool:
    return max(_literal_bytes(v) for v in values) <= budget


@st.composite
def _leaf(draw: st.DrawFn, budget: int) -> Schema:
    """One scalar-valued schema whose longest output fits ``budget`` bytes (budget >= 5)."""
    kind = draw(
        st.sampled_from(
            ["null", "boolean", "integer", "number", "string", "enum", "const", "nullable", "anyOf", "oneOf"]
        )
    )
    if kind in ("null", "boolean"):
        return {"type": kind}
    if kind == "integer":
        return draw(_integer(budget))
    if kind == "number":
        return draw(_number(budget))
    if kind == "string":
        return draw(_string(budget))
    if kind == "enum":
        values = draw(st.lists(_values(budget), min_size=1, max_size=4))
        return {"enum": values}
    if kind == "const":
        return {"const": draw(_values(budget))}
    if kind == "nullable":
        base = draw(st.one_of(_string(budget), _integer(budget)))
        return {**base, "type": [base["type"], "null"]}
    if kind == "anyOf":
        return {"anyOf": draw(st.lists(_leaf(budget), min_size=2, max_size=3))}
    # oneOf: branches of different JSON types, which llguidance can prove disjoint.
    makers = {
        "string": _string(budget),
        "integer": _integer(budget),
        "boolean": st.just({"type": "boolean"}),
        "null": st.just({"type": "null"}),
    }
    types = draw(st.lists(st.sampled_from(sorted(makers)), min_size=2, max_size=3, unique=True))
    return {"oneOf": [draw(makers[t]) for t in types]}


@st.composite
def _object(draw: st.DrawFn, depth: int, budget: int) -> Schema:
    names = draw(st.lists(st.text(NAME_CHARS, min_size=1, max_size=4), max_size=3, unique=True))
    overhead = 2 + sum(_key_bytes(n) + 4 for n in names)
    while names and (budget - overhead) // len(names) < 5:
        overhead -= _key_bytes(names.pop()) + 4
    share = (budget - overhead) // max(len(names), 1)
    props = {name: draw(_node(depth - 1, share)) for name in names}
    if names and draw(st.booleans()):
        # No additionalProperties: bounded only when every property is required and the count is pinned.
        return {"type": "object", "properties": props, "required": names, "maxProperties": len(names)}
    flags = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
    required = [n for n, flag in zip(names, flags, strict=True) if flag]
    schema: Schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


@st.composite
def _array(draw: st.DrawFn, depth: int, budget: int) -> Schema:
    most = draw(st.integers(0, min(3, (budget - 2) // 7)))
    least = draw(st.integers(0, most))
    share = (budget - 2 - 2 * max(most - 1, 0)) // max(most, 1)
    return {"type": "array", "items": draw(_node(depth - 1, share)), "minItems": least, "maxItems": most}


def _node(depth: int, budget: int) -> st.SearchStrategy[Schema]:
    if depth <= 0 or budget < 16:
        return _leaf(budget)
    return st.one_of(_leaf(budget), _object(depth, budget), _array(depth, budget))


def json_schemas(max_depth: int = 2, budget: int = 160) -> st.SearchStrategy[Schema]:
    """Schemas nested at most ``max_depth`` containers deep whose outputs take at most ``budget`` UTF-8 bytes."""
    if budget < 16:
        raise ValueError(f"budget must be >= 16 bytes; got {budget}")
    # The budget is split top-down; a rounding edge (a widened number range) may overshoot it by a byte or two.
    return _node(max_depth, budget).filter(lambda schema: max_output_bytes(schema) <= budget)
