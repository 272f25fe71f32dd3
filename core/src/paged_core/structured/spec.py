"""What a request's output must match: one of a JSON schema, any JSON object, a regex, a choice or a grammar.

The field names are vLLM's (``StructuredOutputsParams``), which the OpenAI-compatible server maps
``response_format`` and the older ``guided_*`` fields onto. :class:`StructuredOutputs` is a frozen
dataclass like :class:`~paged_core.sampling.params.SamplingParams`, so msgspec carries it to a core process
as one of its fields (msgspec runs ``__post_init__`` again on decoding, and the normalised values check
the same).
"""

from __future__ import annotations

import json as _json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from paged_core.structured.errors import ConstraintError

MAX_CONSTRAINT_CHARS = 64 * 1024
"""A schema (as JSON text), regex or grammar, and all of a choice's strings together: at most this many characters."""
MAX_CHOICES = 1024

FIELDS = ("json", "json_object", "regex", "choice", "grammar")


def _schema_text(value: object) -> str:
    """``value`` (a schema dict, or its JSON text) as the JSON text of an object."""
    if isinstance(value, dict):
        try:
            text = _json.dumps(value)  # key order kept: it is the order the model writes properties in
        except (TypeError, ValueError) as exc:
            raise ConstraintError("json", f"the schema is not JSON-serialisable ({exc})") from None
    elif isinstance(value, str):
        text = value
    else:
        raise ConstraintError("json", f"must be a JSON schema (a dict or its JSON text); got {type(value).__name__}")
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ConstraintError("json", f"the schema is {len(text)} characters; at most {MAX_CONSTRAINT_CHARS}")
    if isinstance(value, str):
        try:
            parsed = _json.loads(text)
        except ValueError as exc:
            raise ConstraintError("json", f"is not valid JSON ({exc})") from None
        if not isinstance(parsed, dict):
            raise ConstraintError("json", f"a schema must be a JSON object; got {type(parsed).__name__}")
    return text


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConstraintError(field, f"must be a non-empty str; got {type(value).__name__}")
    if len(value) > MAX_CONSTRAINT_CHARS:
        raise ConstraintError(field, f"is {len(value)} characters; at most {MAX_CONSTRAINT_CHARS}")
    return value


def _choices(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConstraintError("choice", f"must be a list of strings; got {type(value).__name__}")
    items = cast(Sequence[object], value)
    if not items or len(items) > MAX_CHOICES:
        raise ConstraintError("choice", f"must hold 1 to {MAX_CHOICES} strings; got {len(items)}")
    if not all(isinstance(c, str) and c for c in items):
        raise ConstraintError("choice", "every choice must be a non-empty str")
    choices = cast(tuple[str, ...], tuple(items))
    total = sum(len(c) for c in choices)
    if total > MAX_CONSTRAINT_CHARS:
        raise ConstraintError("choice", f"the choices are {total} characters in all; at most {MAX_CONSTRAINT_CHARS}")
    return choices


@dataclass(frozen=True)
class StructuredOutputs:
    """Exactly one constraint on a request's output.

    - ``json``: a JSON schema, as a dict or its JSON text (normalised to the text; :attr:`schema` parses it);
    - ``json_object``: True for any JSON object;
    - ``regex``: the whole output matches this regular expression (Rust ``regex`` syntax, as Python's ``re``
      for the common part);
    - ``choice``: the output is one of these strings (normalised to a tuple);
    - ``grammar``: a Lark grammar (llguidance's dialect: ``start`` is the root rule; regex terminals
      ``/.../``; ``%json {...}`` embeds a schema).

    None, several, or a malformed or oversized one raises :class:`.ConstraintError` (a ``ValueError``)
    naming the field. Whether a schema, regex or grammar is valid is the compiler's to say
    (:meth:`.GrammarCompiler.submit`).
    """

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.json_object, bool):
            raise ConstraintError("json_object", f"must be a bool; got {type(self.json_object).__name__}")
        given = [f for f in FIELDS if (self.json_object if f == "json_object" else getattr(self, f) is not None)]
        if not given:
            raise ConstraintError("json", f"set exactly one of {', '.join(FIELDS)}; none is set")
        if len(given) > 1:
            raise ConstraintError(given[1], f"set exactly one of {', '.join(FIELDS)}; got {' and '.join(given)}")
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.json))
        if self.regex is not None:
            _text("regex", self.regex)
        if self.grammar is not None:
            _text("grammar", self.grammar)
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice))

    @property
    def kind(self) -> str:
        """The field that is set: ``json``, ``json_object``, ``regex``, ``choice`` or ``grammar``."""
        return next(f for f in FIELDS if (self.json_object if f == "json_object" else getattr(self, f) is not None))

    @property
    def schema(self) -> dict[str, Any] | None:
        """``json`` parsed (None when another field is set)."""
        return None if self.json is None else cast("dict[str, Any]", _json.loads(cast(str, self.json)))
