"""A stored document reads back as :func:`json.loads` reads it, whichever
writer wrote it (:func:`sidecar.store.plan.decode_doc` reads with orjson when
orjson writes the same bytes back, else with the standard library)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.errors import StoreUnavailable
from sidecar.store.plan import WrittenText, decode_doc, encode_doc, written_text

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 is not 1.0)."""
    return json.dumps(a) == json.dumps(b) and type(a) is type(b)


@given(VALUES)
def test_every_writer_reads_back_as_json_loads(value: Any) -> None:
    for text in (
        encode_doc(value),
        json.dumps(value, separators=(",", ":")),
        json.dumps(value, separators=(",", ":"), ensure_ascii=False),
    ):
        assert _same(decode_doc("k", text), json.loads(text))
        assert _same(decode_doc("k", text.encode("utf-8", "surrogatepass")), json.loads(text))
    marked = written_text(value)
    assert marked == encode_doc(value)
    assert _same(decode_doc("k", marked), json.loads(marked))


def test_only_orjson_text_is_marked() -> None:
    assert type(written_text({"a": [1, 2.5, "é"]})) is WrittenText
    assert type(written_text({"big": 2**70})) is str  # json.dumps wrote it: checked on read


@pytest.mark.parametrize(
    "text",
    [
        '{"big":1180591620717411303424,"neg":-9223372036854775809}',
        '{"u64":18446744073709551615,"i64":-9223372036854775808}',
        '{"f":1e-07,"g":1e+22,"h":2e-05}',
        '{"s":"\\u00e9\\/","k":1,"k":2}',
        '{"nan":NaN}',
        '{"lone":"\\ud800"}',
    ],
)
def test_texts_orjson_reads_otherwise(text: str) -> None:
    got = decode_doc("k", text)
    assert _same(got, json.loads(text))


def test_damaged_text_is_refused() -> None:
    with pytest.raises(StoreUnavailable):
        decode_doc("k", '{"a":')
