"""Frozen dataclass records, read, copied and changed without the generic machinery.

A task is decoded, changed several times and encoded again on every tool call
and result; :func:`dataclasses.replace` walks :func:`dataclasses.fields` and
runs ``__init__`` with every field again for each change, and a comprehension
of ``getattr`` per field builds each document. The core's records are frozen
dataclasses without ``__post_init__``, ``init=False`` fields, slots or
cached properties (*plain*): ``__init__`` only stores each field, so an instance's ``__dict__``
holds exactly its fields, in definition order. The helpers below keep that
shape and work on ``__dict__`` directly; a record of any other dataclass goes
through :mod:`dataclasses` as before.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar

D = TypeVar("D")


class _Shape(NamedTuple):
    names: tuple[str, ...]
    known: frozenset[str]
    plain: bool


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type) -> _Shape:
    """The field names of the dataclass ``cls`` and whether it is plain (looked up once)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        fields = dataclasses.fields(cls)
        names = tuple(f.name for f in fields)
        plain = (
            not hasattr(cls, "__post_init__")
            and all(f.init for f in fields)
            and "__slots__" not in cls.__dict__
            # A cached value kept in ``__dict__`` would be copied into a changed record.
            and not any(
                isinstance(v, functools.cached_property)
                for k in cls.__mro__
                for v in vars(k).values()
            )
        )
        shape = _SHAPES[cls] = _Shape(names, frozenset(names), plain)
    return shape


def evolve(record: D, **changes: Any) -> D:
    """``dataclasses.replace(record, **changes)``, by a copy of the record's fields.

    :raises TypeError: a name of ``changes`` is not a field (as ``replace``).
    """
    shape = _shape(type(record))
    if not shape.plain or not shape.known.issuperset(changes):
        return dataclasses.replace(record, **changes)  # type: ignore[type-var]
    new = object.__new__(type(record))
    values = new.__dict__
    values.update(record.__dict__)
    values.update(changes)
    return new


def build(cls: type[D], values: Mapping[str, Any]) -> D:
    """``cls(**values)`` for a plain record whose ``values`` name every field
    and nothing else (in any order); anything else goes through ``cls(**values)``.

    :raises TypeError: ``values`` miss a field without a default, or name an unknown one.
    """
    shape = _shape(cls)
    if not shape.plain or values.keys() != shape.known:
        return cls(**values)
    new = object.__new__(cls)
    if tuple(values) == shape.names:
        new.__dict__.update(values)
    else:
        new.__dict__.update((name, values[name]) for name in shape.names)
    return new


def known_items(cls: type, doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the entries of ``doc`` that name a field of ``cls`` (a stored
    document may hold a field a later version dropped)."""
    known = _shape(cls).known
    if doc.keys() <= known:
        return dict(doc)
    return {k: v for k, v in doc.items() if k in known}


def shallow_doc(record: Any) -> dict[str, Any]:
    """The record's fields by name, in definition order (the values themselves,
    not copies: ``asdict`` would deep-copy every nested value)."""
    shape = _shape(type(record))
    values: dict[str, Any] = record.__dict__
    if shape.plain and len(values) == len(shape.names):
        return values.copy()
    return {name: getattr(record, name) for name in shape.names}
