"""A stored document reads back as :func:`json.loads` reads it, whichever
writer wrote it (:func:`sidecar.store.plan.decode_doc` reads with orjson when
orjson writes the same bytes back, else with the standard library)."""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.errors import StoreUnavailable
from sidecar.store import plan, recent
from sidecar.store.plan import (
    LARGE_DOC_CHARS,
    WrittenText,
    decode_doc,
    doc_cost,
    encode_doc,
    written_text,
)

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


def _large(calls: int = 60) -> dict[str, Any]:
    """A document past LARGE_DOC_CHARS, shaped as a task's history."""
    history = [
        {"call_id": f"k{i:016x}", "tool": "search", "status": "ok", "at": 1.5 + i, "rev": i}
        for i in range(calls)
    ]
    return {"task_id": "t1", "calls": history, "seen": {"a": 1}}


def test_a_large_written_text_reads_back_as_the_document_it_was_written_from() -> None:
    doc = _large()
    text = written_text(doc)
    assert len(text) >= LARGE_DOC_CHARS
    assert decode_doc("k", text) is doc  # not read again
    assert _same(decode_doc("k", text), json.loads(text))


def test_a_small_written_text_is_read_from_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "KEEP_DOC_CHARS", LARGE_DOC_CHARS)  # as served (the suite: 0)
    doc = {"task_id": "t1", "calls": []}
    text = written_text(doc)
    got = decode_doc("k", text)
    assert got == doc and got is not doc


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d["calls"][3].update(status="failed"), "$.calls[3].status"),
        (lambda d: d["seen"].update(b=2), "$.seen (members)"),
        (lambda d: d.update(seen={"a": 1.0}), "$.seen.a (float, read int)"),
        (lambda d: d.update(calls=tuple(d["calls"])), "$.calls (tuple, read list)"),
    ],
)
def test_a_kept_document_that_differs_from_its_text_is_refused(change: Any, where: str) -> None:
    """The suite turns the check on (LOOPSTOP_CHECK_KNOWN_DOCS=1, tests/conftest.py):
    a document changed after it was written, or holding a type JSON reads
    otherwise, fails the request that reads it."""
    doc = _large()
    text = written_text(doc)
    change(doc)
    with pytest.raises(RuntimeError, match=re.escape(where)):
        decode_doc("k", text)


def test_recent_values_keep_documents_up_to_their_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    texts = {f"t{i}": written_text(_large()) for i in range(4)}
    assert isinstance(texts["t0"], WrittenText)
    monkeypatch.setattr(recent, "RECENT_DOC_BYTES", 2 * doc_cost(texts["t0"]))
    values = recent.RecentValues()
    values.remember(texts.items())
    kept = [k for k, t in texts.items() if decode_doc(k, t) is t.doc and t.doc is not None]
    assert kept == ["t2", "t3"]  # the two remembered last
    assert all(values.get(k) == t for k, t in texts.items())  # every text is still known
    for key in ("t0", "t1"):  # read from the text once the document is let go
        assert _same(decode_doc(key, texts[key]), json.loads(texts[key]))
    values.forget(["t3"])
    values.remember([("t4", written_text(_large()))])
    assert texts["t2"].doc is not None  # t3's place was freed: nothing else let go


@pytest.mark.parametrize(
    "doc",
    [
        _large(200),  # a task's full history
        {"task_id": "t1", "last_good": [{} for _ in range(20_000)]},  # many tiny containers
        {"task_id": "t1", "result": [[i, "x"] for i in range(5_000)]},
        {"task_id": "t1", "result": "x" * 50_000},  # one long string
        {"result": "x" * 50_000},
        {"task_id": "t1", "result": ["ab"] * 20_000},  # many short strings
        {"task_id": "t1", "result": [{"a": i} for i in range(10_000)]},
        {"task_id": "t1", "result": [[[[[i]]]] for i in range(5_000)]},
        {"task_id": "t1", "result": [{"a": {"b": {"c": i}}} for i in range(3_000)]},
    ],
)
def test_the_cost_a_kept_document_is_budgeted_at_is_at_least_its_memory(doc: Any) -> None:
    """RecentValues budgets kept documents by doc_cost: it must not fall short
    of what the document takes, whatever its shape (a text of many small
    containers takes some 40 times its length)."""
    data = orjson.dumps(doc)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        read = orjson.loads(data)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert read == doc
    assert taken <= doc_cost(data.decode()) <= 4 * max(taken, len(data))
