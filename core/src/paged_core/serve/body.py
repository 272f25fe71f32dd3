"""Reading a request body: size limit, strict UTF-8, JSON, then the pydantic model, each failure a clear 4xx."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from paged_core.serve.errors import APIError

M = TypeVar("M", bound=BaseModel)

# No OpenAI request nests deeper than a handful of levels; 64 leaves room for any real body while keeping
# every later recursive walk (pydantic, the JSON encoder of an error message) far from Python's recursion limit.
MAX_JSON_DEPTH = 64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Bodies larger than this are decoded and validated on a worker thread: a multi-MiB body costs tens of
# milliseconds of pure Python, which would stall every other stream on the event loop.
_INLINE_BYTES = 64 * 1024
# A lone surrogate can only enter through a \uD800-\uDFFF escape (UTF-8 cannot encode one), and an int beyond
# int64 needs 19+ digits: bodies matching neither skip the string and int checks of the walk.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_LONG_DIGITS = re.compile(r"\d{19}")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing (413) anything over ``limit`` bytes before reading all of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # a chunked body can lie by omission: count what actually arrives
                raise APIError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # The client hung up (or the body timeout closed it) mid-body: nobody reads the answer, but it must
        # not be logged as an internal error.
        raise APIError(
            400, "client disconnected before the request body was complete", code="client_disconnected"
        ) from None
    return b"".join(chunks)


def _no_constants(name: str) -> Any:
    raise APIError(400, f"malformed JSON in request body: {name} is not valid JSON", code="invalid_json")


def decode_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; every way it can be malformed or hostile is a 400 saying what and where.

    Refused: invalid UTF-8, syntax errors, ``NaN``/``Infinity``, nesting deeper than :data:`MAX_JSON_DEPTH`,
    integers outside int64 (which also covers Python's 4300-digit conversion limit), and lone surrogates in
    any string or key (they cannot be encoded back to UTF-8, so they would fail deep inside a handler).
    """
    if not raw.strip():
        raise APIError(400, "request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(
            400,
            f"request body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}",
            code="invalid_utf8",
        ) from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise APIError(
            400,
            f"malformed JSON in request body: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            code="invalid_json",
        ) from None
    except RecursionError:  # the C decoder gives up near 1000 levels, far past MAX_JSON_DEPTH anyway
        raise _too_deep(()) from None
    except ValueError:  # an integer literal past Python's int conversion limit (4300 digits)
        raise APIError(
            400,
            f"an integer in the request body is outside the 64-bit range [{INT64_MIN}, {INT64_MAX}]",
            code="invalid_json",
        ) from None
    _check_tree(value, strings=_SURROGATE_ESCAPE.search(text) is not None, ints=_LONG_DIGITS.search(text) is not None)
    return value


def _path(parts: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in parts) or "(body)"


def _too_deep(parts: tuple[str | int, ...]) -> APIError:
    # Named by its top-level field only: the full path would be dozens of list indices.
    field = parts[0] if parts and isinstance(parts[0], str) else None
    where = f" (in '{field}')" if field else ""
    return APIError(
        400, f"request body nests deeper than {MAX_JSON_DEPTH} levels{where}", code="invalid_json", param=field
    )


def _check_leaf(value: Any, parts: tuple[str | int, ...], strings: bool, ints: bool) -> None:
    if strings and isinstance(value, str) and not _encodable(value):
        raise APIError(
            400,
            f"invalid string in '{_path(parts)}': it contains a lone UTF-16 surrogate "
            "(an unpaired \\ud800-\\udfff escape), which is not text",
            param=_path(parts),
        )
    if ints and type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        raise APIError(
            400,
            f"invalid value for '{_path(parts)}': integers must be in the 64-bit range [{INT64_MIN}, {INT64_MAX}]",
            param=_path(parts),
        )


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_tree(value: Any, strings: bool, ints: bool) -> None:
    """Depth, strings and ints of a decoded body, walked with an explicit stack (never recursing)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    _check_leaf(value, (), strings, ints)
    while stack:
        node, depth, parts = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(parts)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            here = (*parts, key)
            if strings and isinstance(key, str) and not _encodable(key):
                raise APIError(
                    400,
                    f"invalid key in '{_path(parts)}': it contains a lone UTF-16 surrogate",
                    param=_path(parts) if parts else None,
                )
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, here))
            elif strings or ints:
                _check_leaf(child, here, strings, ints)


def describe_errors(model: type[BaseModel], exc: ValidationError) -> tuple[str, str | None]:
    """One readable message for a validation failure, and the field it concerns."""
    errors = exc.errors()
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    if first["type"] == "model_type":
        return f"request body must be a JSON object, got {type(first['input']).__name__}", None
    field = loc[0] if loc else None
    if first["type"] == "extra_forbidden":
        extras = [".".join(str(p) for p in e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
        return f"unrecognized request argument(s) supplied: {', '.join(extras)}", extras[0]
    if first["type"] == "missing":
        return f"missing required parameter: '{'.'.join(loc)}'", ".".join(loc)
    same_field = [e for e in errors if e["loc"][:1] == first["loc"][:1]]
    if field in model.model_fields and len(same_field) > 1:
        # A union field: pydantic reports one error per alternative; name the accepted types instead.
        annotation = model.model_fields[field].annotation
        expected = str(annotation).replace("typing.", "")
        return f"invalid type for '{field}': expected {expected}, got {_short(_lookup(exc, field))}", field
    path = ".".join(p for p in loc if not p.startswith(("list[", "str", "int", "dict[")))
    return f"invalid value for '{path}': {first['msg']} (got {_short(first['input'])})", path or field


def _lookup(exc: ValidationError, field: str) -> Any:
    for e in exc.errors():
        if len(e["loc"]) == 2 and e["loc"][0] == field:
            return e["input"]
    return exc.errors()[0]["input"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate(raw: bytes, model: type[M]) -> M:
    """Decode ``raw`` and validate it as ``model``; every failure is an :class:`APIError`."""
    data = decode_json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = describe_errors(model, exc)
        raise APIError(400, message, param=param) from None


async def parse_body(request: Request, model: type[M], limit: int) -> M:
    """Read, decode and validate the body as ``model``; every failure is an :class:`APIError`."""
    raw = await read_body(request, limit)
    if len(raw) <= _INLINE_BYTES:
        return validate(raw, model)  # a thread hop costs more than decoding a small body
    return await asyncio.to_thread(validate, raw, model)
