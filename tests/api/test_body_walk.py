"""The body's quick walk (``_may_be_bad``) and its look at the text
(``_surely_fine``) let through only what the full walk (``_bad_value``,
which names the path) finds nothing in, and duplicate keys are refused with
the first key named twice."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.api.body import (
    MAX_NESTING,
    _bad_value,
    _DuplicateKey,
    _may_be_bad,
    _parse_constant,
    _parse_float,
    _surely_fine,
    _unique_keys,
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**1100), max_value=2**1100)
    | st.floats()
    | st.text(alphabet=st.characters(exclude_categories=()))  # lone surrogates too
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.text(alphabet=st.characters(exclude_categories=()), max_size=3), inner, max_size=3
        )
    ),
    max_leaves=30,
)


@given(VALUES, st.integers(min_value=0, max_value=6))
def test_quick_walk_never_misses_what_the_full_walk_finds(value: Any, limit: int) -> None:
    if _bad_value(value, limit) is not None:
        assert _may_be_bad(value, limit)


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [3, 4, 5])
def test_depth_counts_the_leaf(depth: int) -> None:
    assert _may_be_bad(_nest(depth), 4) is (_bad_value(_nest(depth), 4) is not None)


def test_first_duplicate_key_is_named() -> None:
    assert _unique_keys([("a", 1), ("b", 2)]) == {"a": 1, "b": 2}
    with pytest.raises(_DuplicateKey) as raised:
        _unique_keys([("a", 1), ("b", 2), ("b", 3), ("a", 4)])
    assert raised.value.key == "b"


def _as_parsed(raw: bytes) -> Any:
    """``raw`` read as :func:`sidecar.api.body.read_json_object` reads it."""
    return json.loads(
        raw.decode("utf-8"),
        parse_constant=_parse_constant,
        parse_float=_parse_float,
        object_pairs_hook=_unique_keys,
    )


@given(VALUES, st.booleans(), st.integers(min_value=0, max_value=70))
def test_text_read_as_fine_holds_nothing_the_full_walk_refuses(
    value: Any, ascii_only: bool, depth: int
) -> None:
    text = json.dumps(_nest_in(value, depth), ensure_ascii=ascii_only)
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written raw: not a body a client sends
        return
    if _surely_fine(raw):
        assert _bad_value(_as_parsed(raw), MAX_NESTING) is None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1e400}',
        b'{"a": -1E+999}',
        b'{"a": NaN}',
        b'{"a": [Infinity]}',
        b'{"a": "\\ud800"}',
        b'{"a": ' + b"9" * 309 + b"}",
        b'{"a": ' + b"9" * 309 + b".5}",
        b"[" * (MAX_NESTING + 1) + b"1" + b"]" * (MAX_NESTING + 1),
    ],
)
def test_text_that_may_hold_a_refused_value_is_walked(raw: bytes) -> None:
    assert not _surely_fine(raw)
    assert _bad_value(_as_parsed(raw), MAX_NESTING) is not None


def _nest_in(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = {"k": value}
    return value
