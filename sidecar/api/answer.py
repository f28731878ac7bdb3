"""A view's answer: a response model as JSON, serialized once by pydantic."""

from __future__ import annotations

import json

from flask import Response
from pydantic import BaseModel


def json_answer(model: BaseModel, status: int = 200) -> Response:
    """``model`` as an ``application/json`` response.

    pydantic writes the text (``model_dump_json``, compact) without the
    intermediate dict ``jsonify(model.model_dump(mode="json"))`` built. An
    answer holding non-ASCII text is re-written with :func:`json.dumps` as
    ``jsonify`` writes it (ASCII, ``\\u`` escapes), so clients see the same
    characters either way; ids, decisions and timestamps are ASCII, so that
    path is rare.
    """
    text = model.model_dump_json()
    if not text.isascii():
        text = json.dumps(json.loads(text), separators=(",", ":"))
    return Response(text, status=status, mimetype="application/json")
