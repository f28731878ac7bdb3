"""Request parsing: JSON bodies, query strings and path values into pydantic models.

Every failure becomes a :class:`~sidecar.errors.LoopstopError` with the
field that is wrong, so a bad request changes nothing and crashes nothing:

- 415 when a body is sent with a non-JSON content type;
- 413 past ``http.max_body_bytes`` (werkzeug enforces it while reading);
- 400 when the bytes are not UTF-8 JSON (with line and column), and when an
  object names a key twice (RFC 8259 §4 leaves the meaning open; two
  parsers could read two different requests);
- 422 for NaN/Infinity (Python's parser accepts them, JSON does not:
  RFC 8259 §6), for a body that is not an object, and for every field
  pydantic rejects, each as ``{loc: ["body", ...], msg}``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from flask import Request, current_app, request
from pydantic import BaseModel, ValidationError

from sidecar.errors import (
    MalformedRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
)

M = TypeVar("M", bound=BaseModel)

#: Where a request's body is kept once read (its WSGI environ).
_BODY = "loopstop.body"
#: The callable the WSGI server sets, called once the body is read
#: (``sidecar.serving.BODY_READ``).
_BODY_READ = "loopstop.request_read"

#: How deep a request body may nest (objects and arrays). Real n8n items stay
#: far below; the bound keeps every later walk over the body cheap and safe.
MAX_NESTING = 64


class _NonFinite(float):
    """Marks a NaN/Infinity literal so its location can be reported."""


def _parse_constant(name: str) -> float:
    return _NonFinite("nan")


class _DuplicateKey(ValueError):
    """An object in the body names the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # a key named twice: the first one, in order
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _parse_float(text: str) -> float:
    value = float(text)
    return _NonFinite("nan") if not math.isfinite(value) else value  # 1e400 -> inf


def _is_json_type(mimetype: str) -> bool:
    return mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    )


def read_raw_body(limit: int) -> bytes:
    """The body bytes, at most ``limit``, whether sent with Content-Length or chunked.

    :raises PayloadTooLarge: the declared or actual length exceeds ``limit``.
    """
    return _read_raw_body(current_request(), limit)


def current_request() -> Request:
    """The request itself, not its proxy (each attribute read through
    ``flask.request`` looks the context up again)."""
    return cast(Request, request._get_current_object())  # type: ignore[attr-defined]


def _read_raw_body(req: Request, limit: int) -> bytes:
    environ = req.environ
    cached = environ.get(_BODY)
    if isinstance(cached, bytes):
        return cached
    declared = req.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"the body exceeds {limit} bytes")
    raw = req.stream.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(f"the body exceeds {limit} bytes")
    keep_body(environ, raw)
    return raw


def keep_body(environ: dict[str, Any], raw: bytes) -> None:
    """Keep ``raw``, the whole body read, where :func:`read_raw_body` finds it
    (it is not read again), and tell the WSGI server the request has arrived
    (``sidecar.serving``'s ``BODY_READ``: its read deadline no longer applies)."""
    environ[_BODY] = raw
    done = environ.get(_BODY_READ)
    if callable(done):
        done()


def read_json_object() -> dict[str, Any]:
    """The request body as a JSON object; an empty body counts as ``{}``.

    :raises UnsupportedMediaType, PayloadTooLarge, MalformedRequest, ValidationFailed:
    """
    req = current_request()
    raw = _read_raw_body(req, current_app.config["LOOPSTOP_MAX_BODY_BYTES"])
    if not raw.strip():
        return {}
    mimetype = req.mimetype
    if not _is_json_type(mimetype):
        raise UnsupportedMediaType(
            f"send the body as application/json (got {mimetype or 'no content type'!r})"
        )
    return decode_json_object(raw)


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """``raw``, a JSON body that is not blank, as a JSON object.

    :raises MalformedRequest: not UTF-8 JSON, a key named twice in one object,
        nested too deeply for the parser.
    :raises ValidationFailed: a value no JSON peer reads back (:func:`_bad_value`),
        or not an object.
    """
    try:
        data = json.loads(
            raw.decode("utf-8"),
            parse_constant=_parse_constant,
            parse_float=_parse_float,
            object_pairs_hook=_unique_keys,
        )
    except _DuplicateKey as exc:
        raise MalformedRequest(
            f"the body names the key {exc.key[:100]!r} twice in one object"
        ) from exc
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"the body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise MalformedRequest(
            f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except RecursionError as exc:
        raise MalformedRequest("the body nests too deeply") from exc
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise MalformedRequest(f"the body is not valid JSON: {exc}") from exc
    suspect = not _surely_fine(raw) and _may_be_bad(data, MAX_NESTING)
    problem = _bad_value(data, MAX_NESTING) if suspect else None
    if problem is not None:
        where, msg = problem
        raise ValidationFailed([{"loc": ["body", *where], "msg": msg}])
    if not isinstance(data, dict):
        raise ValidationFailed([{"loc": ["body"], "msg": "the body must be a JSON object"}])
    return data


#: What text must hold for a parsed body to hold a value :func:`_bad_value`
#: refuses: a digit before an exponent (a float may overflow to infinity), 309
#: digits in a row (an integer past a double's range, or a float that
#: overflows), a NaN or Infinity literal, or a ``\\u`` escape (a lone
#: surrogate; the other way to one, raw non-ASCII bytes, is excluded apart).
_SUSPECT = re.compile(rb"[0-9][eE]|[0-9]{309}|NaN|Infinity|\\u")


def _surely_fine(raw: bytes) -> bool:
    """True when the JSON text ``raw`` cannot hold a value :func:`_bad_value`
    refuses, read off the bytes without walking the parsed value: ASCII text
    (no lone surrogate but by an escape), no :data:`_SUSPECT` match, and no
    more opening brackets than :data:`MAX_NESTING` (nothing nests deeper).
    False says nothing: the value is then walked."""
    return (
        raw.isascii()
        and raw.count(b"{") + raw.count(b"[") <= MAX_NESTING
        and _SUSPECT.search(raw) is None
    )


def _may_be_bad(value: Any, limit: int) -> bool:
    """False when :func:`_bad_value` would find nothing in ``value`` (the
    same walk and checks, without the paths only :func:`_bad_value` builds;
    an ASCII string is Unicode text without encoding it)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        kind = type(node)
        if kind is str:
            if not node.isascii() and not _is_text(node):
                return True
        elif kind is dict:
            for k, v in node.items():
                if type(k) is not str or (not k.isascii() and not _is_text(k)):
                    return True
                stack.append((v, depth + 1))
        elif kind is list:
            stack.extend((v, depth + 1) for v in node)
        elif kind is int:
            if abs(node) > _MAX_DOUBLE:
                return True
        elif kind is float:
            if not math.isfinite(node):
                return True
        elif kind is not bool and node is not None:
            return True  # anything else (a NaN literal's marker): the full walk tells
    return False


def _bad_value(value: Any, limit: int) -> tuple[list[str | int], str] | None:
    """The first value no JSON peer could read back, with its path, or None.

    One iterative walk checks what Python's parser lets through but RFC 8259
    and RFC 8785 do not: nesting past ``limit``, NaN and Infinity, strings
    with lone surrogates (not Unicode text, so not canonicalizable), and
    integers beyond the range of a double. Rejecting them here means every
    stored value can be canonicalized and compared later.
    """
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > limit:
            return path[: limit + 1], f"nested deeper than {limit} levels"
        if isinstance(node, dict):
            for k, v in node.items():
                if not _is_text(k):
                    return path, "an object key holds a lone surrogate: not Unicode text"
                stack.append((v, [*path, k]))
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(node))
        elif isinstance(node, str):
            if not _is_text(node):
                return path, "the string holds a lone surrogate: not Unicode text"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return path, "NaN and Infinity are not JSON values"
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > _MAX_DOUBLE:
            return path, "the number is out of range"
    return None


_MAX_DOUBLE = int(sys.float_info.max)


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
