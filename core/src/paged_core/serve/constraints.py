"""Structured outputs on the OpenAI routes: the request fields that constrain the output, checked once here.

A request sets at most one source: ``response_format`` (``json_object`` or ``json_schema``), vLLM's
``structured_outputs`` body field, one of the older ``guided_json``/``guided_regex``/``guided_choice``/
``guided_grammar``, or (chat) ``tool_choice`` ``required`` or a named function over ``tools``. It becomes one
:class:`~paged_core.structured.StructuredOutputs` (:func:`request_constraint`), which :class:`RouteCompiler`
compiles for the server's tokenizer before the request is admitted: a malformed or refused constraint is a 400
naming the request's own field (``response_format.json_schema.schema``, ``guided_regex``...), and the core, which
trusts the server, never sees it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatCompletionRequest, CompletionRequest
from paged_core.serve.tools.validate import tool_schema
from paged_core.structured.errors import ConstraintError
from paged_core.structured.spec import StructuredOutputs

if TYPE_CHECKING:  # the compiler imports llguidance, which the server loads on the first constraint
    from paged_core.structured.compiler import GrammarCompiler

log = logging.getLogger(__name__)

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


@dataclass(frozen=True)
class Constraint:
    """A request's constraint and where it came from: ``params`` maps a spec field to the request's field."""

    spec: StructuredOutputs
    params: dict[str, str]

    def error(self, exc: ConstraintError) -> APIError:
        """``exc`` as a 400 naming the request's field instead of the spec's."""
        return _named(exc, self.params)


def _build(fields: dict[str, Any], params: dict[str, str]) -> Constraint:
    """A :class:`Constraint` of ``fields`` (StructuredOutputs' keywords); malformed ones are 400s naming the field."""
    try:
        spec = StructuredOutputs(**fields)
    except ConstraintError as exc:
        raise _named(exc, params) from None
    return Constraint(spec, params)


def _named(exc: ConstraintError, params: dict[str, str]) -> APIError:
    param = params.get(exc.field, next(iter(params.values())))
    message = str(exc).replace(f"structured_outputs.{exc.field}", param, 1)
    return APIError(400, message, param=param)


Source = tuple[str, dict[str, Any], dict[str, str]]
"""A field that constrains the output: its name, StructuredOutputs' keywords, and the spec-to-request field map."""


def _sources(req: CompletionRequest | ChatCompletionRequest) -> list[Source]:
    """Each constraint source the request sets."""
    found: list[Source] = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", {"json_object": True}, {"json_object": "response_format"}))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(
                400, "response_format of type 'json_schema' needs a json_schema object", param="response_format"
            )
        param = "response_format.json_schema.schema"
        found.append(("response_format", {"json": fmt.json_schema.schema_}, {"json": param}))
    so = req.structured_outputs
    if so is not None:
        given = {k: v for k, v in so.model_dump(by_alias=True).items() if v is not None}
        if given.get("json_object") is False:
            del given["json_object"]  # false asks for nothing
        found.append(("structured_outputs", given, {k: f"structured_outputs.{k}" for k in given}))
    for name in GUIDED:
        value = getattr(req, name)
        if value is not None:
            kind = name.removeprefix("guided_")
            found.append((name, {kind: value}, {kind: name}))
    if isinstance(req, ChatCompletionRequest):
        forced = tool_schema(req)
        if forced is not None:
            found.append(("tool_choice", {"json": forced[0]}, {"json": forced[1]}))
    return found


def request_constraint(req: CompletionRequest | ChatCompletionRequest) -> Constraint | None:
    """The request's constraint (None when it sets none); several sources, or a malformed one, are 400s."""
    found = _sources(req)
    if not found:
        return None
    if len(found) > 1:
        names = [name for name, _, _ in found]
        raise APIError(
            400,
            f"set at most one way to constrain the output; got {' and '.join(names)}",
            param=names[1],
        )
    name, fields, params = found[0]
    return _build(fields, params or {"json": name})


class RouteCompiler:
    """The server's :class:`~paged_core.structured.GrammarCompiler`, built from ``factory`` on the first constraint.

    Building it wraps the tokenizer (about 1.5 s), so it happens on a worker thread, once; compiles run on the
    compiler's own pool and are awaited, never blocking the event loop.
    """

    def __init__(self, factory: Callable[[], GrammarCompiler]) -> None:
        self._factory = factory
        self._compiler: GrammarCompiler | None = None
        self._unavailable: str | None = None  # why the compiler cannot be built (remembered: each try costs seconds)
        self._lock = threading.Lock()

    def _get(self) -> GrammarCompiler | None:
        with self._lock:
            if self._compiler is None and self._unavailable is None:
                try:
                    self._compiler = self._factory()
                except ImportError as exc:
                    self._unavailable = f"they need llguidance (install paged-core[models]): {exc}"
                except Exception as exc:  # a tokenizer llguidance cannot wrap: a limit of this server, said once
                    log.warning("structured outputs are unavailable: %r", exc)
                    self._unavailable = f"this model's tokenizer cannot be used by the grammar engine ({exc})"
            return self._compiler

    async def check(self, constraint: Constraint | None) -> None:
        """Compile ``constraint`` for the server's tokenizer; one it refuses (or that runs out of time) is a 400."""
        if constraint is None:
            return
        compiler = self._compiler or await asyncio.to_thread(self._get)
        if compiler is None:
            param = next(iter(constraint.params.values()))
            raise APIError(
                400, f"structured outputs are not available on this server: {self._unavailable}", param=param
            )
        try:
            await asyncio.wrap_future(compiler.submit(constraint.spec))
        except ConstraintError as exc:
            raise constraint.error(exc) from None

    def close(self) -> None:
        """Stop the compiler's pool, if it was ever built."""
        if self._compiler is not None:
            self._compiler.close()


def constraint_source(req: CompletionRequest | ChatCompletionRequest) -> str:
    """The name of the field that constrains ``req``'s output (``structured_outputs`` if none does)."""
    found = _sources(req)
    return found[0][0] if found else "structured_outputs"
