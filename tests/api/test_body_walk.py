"""The body's quick walk (``_may_be_bad``) lets through only what the full
walk (``_bad_value``, which names the path) finds nothing in, and duplicate
keys are refused with the first key named twice."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.api.body import _bad_value, _DuplicateKey, _may_be_bad, _unique_keys

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
