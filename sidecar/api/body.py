"""Request parsing: JSON bodies, query strings and path values into pydantic models.

Every failure becomes a :class:`~sidecar.errors.LoopstopError` with the
field that is wrong, so a bad request changes nothing and crashes nothing:

- 415 when a body is sent with a non-JSON content type;
- 413 past ``http.max_body_bytes`` (werkzeug enforces it while reading);
- 400 when the bytes are not UTF-8 JSON (with line and column);
- 422 for NaN/Infinity (Python's parser accepts them, JSON does not:
  RFC 8259 §6), for a body that is not an object, and for every field
  pydantic rejects, each as ``{loc: ["body", ...], msg}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from flask import request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import RequestEntityTooLarge

from sidecar.canonical import find_non_finite
from sidecar.errors import (
    MalformedRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
)

M = TypeVar("M", bound=BaseModel)

#: How deep a request body may nest (objects and arrays). Real n8n items stay
#: far below; the bound keeps every later walk over the body cheap and safe.
MAX_NESTING = 64


class _NonFinite(float):
    """Marks a NaN/Infinity literal so its location can be reported."""


def _parse_constant(name: str) -> float:
    return _NonFinite("nan")


def _parse_float(text: str) -> float:
    value = float(text)
    return _NonFinite("nan") if not math.isfinite(value) else value  # 1e400 -> inf


def _is_json_type(mimetype: str) -> bool:
    return mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    )


def read_json_object() -> dict[str, Any]:
    """The request body as a JSON object; an empty body counts as ``{}``.

    :raises UnsupportedMediaType, PayloadTooLarge, MalformedRequest, ValidationFailed:
    """
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"the body exceeds {request.max_content_length} bytes") from exc
    if not raw.strip():
        return {}
    if not _is_json_type(request.mimetype):
        raise UnsupportedMediaType(
            f"send the body as application/json (got {request.mimetype or 'no content type'!r})"
        )
    try:
        data = json.loads(
            raw.decode("utf-8"), parse_constant=_parse_constant, parse_float=_parse_float
        )
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"the body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise MalformedRequest(
            f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except RecursionError as exc:
        raise MalformedRequest("the body nests too deeply") from exc
    bad = find_non_finite(data)
    if bad is not None:
        raise ValidationFailed(
            [{"loc": ["body", *bad], "msg": "NaN and Infinity are not JSON values"}]
        )
    too_deep = _too_deep(data, MAX_NESTING)
    if too_deep is not None:
        raise ValidationFailed(
            [{"loc": ["body", *too_deep], "msg": f"nested deeper than {MAX_NESTING} levels"}]
        )
    if not isinstance(data, dict):
        raise ValidationFailed([{"loc": ["body"], "msg": "the body must be a JSON object"}])
    return data


def _too_deep(value: Any, limit: int) -> list[str | int] | None:
    """The path at which ``value`` nests deeper than ``limit``, or None (iterative)."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > limit:
            return path[: limit + 1]
        if isinstance(node, dict):
            stack.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(node))
    return None


def _errors(exc: ValidationError, where: str) -> list[dict[str, Any]]:
    return [
        {"loc": [where, *err["loc"]], "msg": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False)
    ]


def parse_body(model: type[M]) -> M:
    """Validate the JSON body against ``model``.

    :raises ValidationFailed: with ``loc`` starting ``"body"``.
    """
    data = read_json_object()
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed(_errors(exc, "body")) from exc


def parse_query(model: type[M]) -> M:
    """Validate the query string against ``model`` (a repeated key is an error).

    :raises ValidationFailed: with ``loc`` starting ``"query"``.
    """
    args = request.args
    repeated = [k for k in args if len(args.getlist(k)) > 1]
    if repeated:
        raise ValidationFailed([{"loc": ["query", repeated[0]], "msg": "given more than once"}])
    try:
        return model.model_validate(dict(args))
    except ValidationError as exc:
        raise ValidationFailed(_errors(exc, "query")) from exc


def check_path(values: Mapping[str, str], patterns: Mapping[str, Any]) -> None:
    """Check path values against compiled regular expressions.

    :raises ValidationFailed: with ``loc`` ``["path", name]``.
    """
    errs = [
        {"loc": ["path", name], "msg": f"must match {pattern.pattern}"}
        for name, pattern in patterns.items()
        if not pattern.fullmatch(values[name])
    ]
    if errs:
        raise ValidationFailed(errs)
