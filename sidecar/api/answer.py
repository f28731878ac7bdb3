"""A view's answer: a response model as JSON, serialized once by pydantic."""

from __future__ import annotations

import functools
import json
import re
from typing import Any, TypeVar

from flask import Response
from pydantic import BaseModel

B = TypeVar("B", bound=BaseModel)

#: A float pydantic writes as ``1e-7`` where :func:`json.dumps` writes ``1e-07``.
_SHORT_EXPONENT = re.compile(r"[0-9]e-[0-9](?![0-9])")


def json_answer(model: BaseModel, status: int = 200) -> Response:
    """``model`` as an ``application/json`` response.

    pydantic writes the text (``model_dump_json``, compact) without the
    intermediate dict ``jsonify(model.model_dump(mode="json"))`` built. Where
    the two writers differ, the answer is re-written with :func:`json.dumps`
    as ``jsonify`` writes it: non-ASCII text (``\\u`` escapes) and a float
    pydantic writes in another form (``1e-7`` for ``1e-07``, ``0.00002`` for
    ``2e-05``). Ids, decisions, timestamps and counts are neither, so that
    path is rare.
    """
    return Response(answer_text(model), status=status, mimetype="application/json")


def answer_text(model: BaseModel) -> str:
    """``model``'s JSON text as :func:`json_answer` sends it (compact, as ``jsonify``
    writes it where pydantic's writer differs)."""
    text = model.model_dump_json()
    if not text.isascii() or "0.0000" in text or ("e-" in text and _SHORT_EXPONENT.search(text)):
        text = json.dumps(json.loads(text), separators=(",", ":"))
    return text


def built(model: type[B], **fields: Any) -> B:
    """An instance of ``model`` holding ``fields`` as given, unvalidated: what
    :meth:`pydantic.BaseModel.model_construct` makes when every field is
    given, without its per-field walk over defaults and aliases.

    For answers built from stored records whose values have their types
    already; ``fields`` must name every field of ``model`` (none has an alias,
    a default used or a private attribute).

    :raises TypeError: a field is missing or unknown.
    """
    if fields.keys() != _field_names(model):
        raise TypeError(f"{model.__name__}: fields {sorted(fields)} are not its own")
    made = model.__new__(model)
    _set = object.__setattr__
    _set(made, "__dict__", fields)
    _set(made, "__pydantic_fields_set__", set(fields))
    _set(made, "__pydantic_extra__", None)
    _set(made, "__pydantic_private__", None)
    return made


@functools.cache
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """``model``'s field names (pydantic builds its ``model_fields`` anew on each read)."""
    return frozenset(model.model_fields)
