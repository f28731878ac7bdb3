"""Which part of an activation counts, and the form a value takes for echo
matching (DESIGN §2, "Field equality"). Pure functions, no I/O."""

from __future__ import annotations

import math
import re
from typing import Any

#: A numeric string as a sheet or a form writes a number: no sign but "-", no
#: leading zeros, no exponent, at most 15 significant digits (what a double
#: holds exactly). Phone numbers, zip codes and long ids stay text.
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?")
_MAX_DIGITS = 15


def normalize_scalar(value: Any) -> Any:
    """The form a value takes for echo matching (DESIGN §2, "Field equality").

    Google Sheets returns ``""`` for empty, ``0`` and ``false`` cells, a text
    cell returns ``"42"`` where the flow wrote ``42``, and a form sends every
    value as a string. So: numbers and plain decimal strings compare by
    value (``5`` == ``5.0`` == ``" 5 "``; not ``"+49..."``, ``"01234"``,
    ``"1e3"`` or more than 15 digits, which stay text), strings are
    trimmed, ``"true"`` is
    ``true``, and ``""``, ``null``, ``0``, ``false`` and ``"false"`` are
    all the same empty value. Objects and lists are compared as they are.
    Dates are not converted.
    """
    if value is None or value is False:
        return None
    if value is True:
        return True
    if isinstance(value, int | float):
        return None if value == 0 else float(value)
    if isinstance(value, str):
        text = value.strip()
        lowered = text.lower()
        if text == "" or lowered == "false":
            return None
        if lowered == "true":
            return True
        if _NUMBER.fullmatch(text) and sum(c.isdigit() for c in text) <= _MAX_DIGITS:
            number = float(text)
            if math.isfinite(number):
                return None if number == 0 else number
        return text
    return value


# -- content ---------------------------------------------------------------------


def content_of(content: Any, event: Any) -> Any:
    """The part of an activation that counts for dedupe and echo matching.

    ``content`` when given; else the ``event``, except that an n8n Webhook
    item (``{headers, params, query, body}``) counts by its ``body`` (a
    provider's redelivery repeats the body, not its transport headers; an
    empty body, as a GET has, counts by its query and path parameters), and
    a Google Sheets "Include Both Versions" item by its ``current`` row.
    """
    if content is not None:
        return content
    if isinstance(event, dict):
        if "headers" in event and "body" in event and ("query" in event or "params" in event):
            if event["body"] not in ({}, None, ""):
                return event["body"]
            # A GET (or an empty POST): what identifies it is its query and path.
            return {"query": event.get("query"), "params": event.get("params")}
        if "current" in event and "previous" in event:
            return event["current"]
        return event
    return {} if event is None else event


# -- state ----------------------------------------------------------------------
