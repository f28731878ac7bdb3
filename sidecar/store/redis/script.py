"""The compare-and-set script (``lua/cas.lua``, whose header names every
``KEYS[i]`` and ``ARGV[i]``) and how a plan becomes its keys and arguments."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson

from sidecar.store.plan import Plan, written, written_text

#: The script's text, registered once per store object.
CAS = resources.files("sidecar.store").joinpath("lua/cas.lua").read_text()

#: What the script answers when it ran past its fence (nothing written).
FENCED = -1

#: The longest TTL written (ten years): a longer retention is "forever" in practice.
MAX_TTL_MS = 10 * 365 * 86_400 * 1000


def ttl_ms(ttl_s: float | None) -> str:
    """A TTL for the script: milliseconds as a decimal string ("0" keeps for ever).

    A string, because Lua would print a large number as 1e+18.
    """
    ms = 0 if ttl_s is None else max(1, math.ceil(ttl_s * 1000))
    return str(min(ms, MAX_TTL_MS))


def _plan_json(plan: dict[str, Any]) -> bytes:
    """The plan argument's JSON, UTF-8 (orjson; :func:`json.dumps` for a member
    name orjson refuses, a lone surrogate): the script's ``cjson`` reads
    either the same."""
    try:
        return orjson.dumps(plan)
    except TypeError:
        return json.dumps(plan, separators=(",", ":")).encode()


def serialized(plan: Plan[Any]) -> dict[str, str | None]:
    """The text of every document the plan writes (None: deleted), marked
    when orjson wrote it (:func:`~sidecar.store.plan.written_text`): the texts
    :class:`~sidecar.store.recent.RecentValues` keeps are read back
    without a check."""
    return {key: None if w.doc is None else written_text(w.doc) for key, w in plan.writes.items()}


@dataclass(frozen=True)
class ScriptCall:
    """One run of ``cas.lua``, its keys and arguments already UTF-8 (as
    redis-py would encode them: it sends bytes as they are).

    :ivar doc_keys: the compared documents' logical keys, in ``KEYS`` order.
    :ivar keys: every ``KEYS[i]`` (prefixed).
    :ivar args: every ``ARGV[i]``.
    :ivar texts: the text of every document the plan writes (:func:`serialized`).
    """

    doc_keys: list[str]
    keys: list[bytes]
    args: list[bytes]
    texts: dict[str, str | None]


def script_call(
    raw: dict[str, str | None],
    plan: Plan[Any],
    prefix: str,
    *,
    compare_unchecked: bool = False,
    fence_ms: int | None = None,
) -> ScriptCall:
    """The keys and arguments that apply ``plan`` if every document of ``raw``
    (less the plan's unchecked keys) still holds the raw value read.

    :param compare_unchecked: compare the plan's unchecked keys too (a plan
        decided on a guess: nothing it read may stand unchecked), those a
        :class:`~sidecar.store.Bound` of the plan covers against their bound.
    :param fence_ms: the server time (epoch milliseconds) past which the
        script writes nothing and answers :data:`FENCED` (None: no fence).
    :raises RuntimeError: the plan writes a key it did not read, or cannot be
        applied safely (:meth:`Plan.check`).
    """
    plan.check()
    unchecked = plan.unchecked
    if compare_unchecked or not unchecked:
        doc_keys = list(raw)
    else:
        doc_keys = [k for k in raw if k not in unchecked]
    texts: dict[str, str | None] = {}
    data: dict[str, bytes] = {}
    for key, write in plan.writes.items():
        if write.doc is None:
            texts[key] = None
        else:
            texts[key], data[key] = written(write.doc)
    position = {k: i for i, k in enumerate(doc_keys, 1)}
    writes: list[list[Any]] = []
    values: list[bytes] = []  # ARGV after the plan: the new documents
    first_value = len(doc_keys) + 3  # ARGV position of the first of them
    for key, write in plan.writes.items():
        at = position.get(key)
        if at is None:
            raise RuntimeError(f"transaction wrote {key!r} without reading it")
        if write.doc is None:
            writes.append([at, None, ttl_ms(write.ttl_s)])
        else:
            writes.append([at, first_value + len(values), ttl_ms(write.ttl_s)])
            values.append(data[key])
    ipos: dict[str, int] = {}  # index key -> its position among the indexes
    index_ops: list[list[Any]] = []
    for e in plan.index:
        at = ipos.setdefault(e.index, len(ipos) + 1)
        index_ops.append([at, e.member, None if e.score is None else repr(float(e.score))])
    trims = [
        [ipos.setdefault(name, len(ipos) + 1), repr(float(below))] for name, below in plan.trims
    ]
    first = len(doc_keys) + len(ipos) + 1  # KEYS position of the first increment
    increments = [
        [first + i, inc.field, inc.delta, ttl_ms(inc.ttl_s)]
        for i, inc in enumerate(plan.increments.values())
    ]
    keys = [(prefix + k).encode() for k in (*doc_keys, *ipos, *plan.increments)]
    args = [b"%d" % len(doc_keys)]
    args += [(raw[k] or "").encode() for k in doc_keys]
    shape: dict[str, Any] = {"w": writes, "x": index_ops, "t": trims, "i": increments}
    if compare_unchecked and plan.bounds:  # on a guess: bounded keys checked by their bound
        if any(k not in position for b in plan.bounds for k in b.keys):
            raise RuntimeError("a bound on a key the transaction did not read")
        shape["b"] = [
            [
                [[position[k], w] for k, w in zip(b.keys, b.weights, strict=True)],
                b.field,
                b.below,
                b.at_least,
            ]
            for b in plan.bounds
        ]
    if fence_ms is not None:
        shape["f"] = fence_ms
    args.append(_plan_json(shape))
    args += values
    return ScriptCall(doc_keys, keys, args, texts)
