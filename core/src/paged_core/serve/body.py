"""Reading a request body: size limit, strict UTF-8, JSON, then the pydantic model, each failure a clear 4xx."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from paged_core.serve.errors import APIError

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing (413) anything over ``limit`` bytes before reading all of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a chunked body can lie by omission: count what actually arrives
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; invalid UTF-8 and malformed JSON are 400s saying where."""
    if not raw.strip():
        raise APIError(400, "request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}",
                       code="invalid_utf8") from None  # fmt: skip
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(
            400, f"malformed JSON in request body: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            code="invalid_json",
        ) from None  # fmt: skip


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


async def parse_body(request: Request, model: type[M], limit: int) -> M:
    """Read, decode and validate the body as ``model``; every failure is an :class:`APIError`."""
    data = decode_json(await read_body(request, limit))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = describe_errors(model, exc)
        raise APIError(400, message, param=param) from None
