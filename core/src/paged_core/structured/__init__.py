"""Structured outputs: constraints on a request's text, compiled to grammars that mask each step's logits.

- :mod:`~paged_core.structured.spec`: :class:`StructuredOutputs`, one of ``json`` (a schema),
  ``json_object``, ``regex``, ``choice`` or ``grammar`` (Lark), checked when built;
- :mod:`~paged_core.structured.compiler`: :class:`GrammarCompiler`, once per tokenizer, compiles on a
  small thread pool (``submit(spec) -> Future``) with a size bound and a timeout;
- :mod:`~paged_core.structured.matcher`: :class:`GrammarMatcher`, one sequence's state (accept, validate,
  rollback, fork);
- :mod:`~paged_core.structured.bitmask`: a batch's bitmask, filled from its matchers and applied to logits;
- :mod:`~paged_core.structured.errors`: the errors, each naming the field.

The engine is llguidance (chosen by benchmarks/grammar_engines.py), in paged-core's ``[models]`` extra.
"""

from __future__ import annotations

from paged_core.structured.bitmask import allocate_bitmask, apply_bitmask, bitmask_width, fill_bitmask
from paged_core.structured.compiler import CompiledGrammar, GrammarCompiler
from paged_core.structured.errors import ConstraintCompileError, ConstraintError, ConstraintTimeoutError
from paged_core.structured.matcher import GrammarMatcher
from paged_core.structured.spec import StructuredOutputs

__all__ = [
    "CompiledGrammar",
    "ConstraintCompileError",
    "ConstraintError",
    "ConstraintTimeoutError",
    "GrammarCompiler",
    "GrammarMatcher",
    "StructuredOutputs",
    "allocate_bitmask",
    "apply_bitmask",
    "bitmask_width",
    "fill_bitmask",
]
