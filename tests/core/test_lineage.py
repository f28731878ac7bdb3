"""The pagination lineage's fixed-size memory (sidecar.core.lineage): which way it errs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.lineage import (
    CURSOR_BUCKETS,
    ID_BUCKETS,
    WAYS,
    Lineage,
    SlotTable,
    step_page,
)

ids = st.integers(min_value=0, max_value=400).map(lambda i: f"record-{i}")
pages = st.lists(
    st.tuples(st.none() | st.sampled_from(["A", "B", "C", "D"]), st.lists(ids, max_size=12)),
    max_size=40,
)


def exact(history: list[tuple[str | None, list[str]]]) -> list[tuple[str, int]]:
    """The rule on unbounded sets: (reason, new records) per page."""
    seen: set[str] = set()
    cursors: set[str] = set()
    out = []
    for cursor, page in history:
        fresh = set(page) - seen
        repeated = cursor is not None and cursor in cursors
        seen |= fresh
        if cursor is not None:
            cursors.add(cursor)
        reason = "passed" if fresh else ("cycle" if repeated else "no_new_records")
        out.append((reason, len(fresh)))
    return out


def run(lineage: Lineage, history: list[tuple[str | None, list[str]]]) -> list[tuple[str, int]]:
    out = []
    for cursor, page in history:
        lineage, verdict = step_page(lineage, cursor, page)
        out.append((verdict.reason, verdict.new_records))
    return out


@settings(max_examples=300, deadline=None)
@given(pages)
def test_a_new_page_never_looks_old_even_in_a_tiny_table(
    history: list[tuple[str | None, list[str]]],
) -> None:
    # One bucket of 16 slots: most ids are forgotten, which must only ever
    # make an old page pass, never a page with a new id fail.
    tiny = Lineage(SlotTable(1), SlotTable(1))
    for (reason, fresh), (true_reason, true_fresh) in zip(
        run(tiny, history), exact(history), strict=True
    ):
        if true_reason == "passed":
            assert reason == "passed"
        assert fresh >= true_fresh


@settings(max_examples=300, deadline=None)
@given(pages)
def test_a_lineage_that_fits_answers_exactly(history: list[tuple[str | None, list[str]]]) -> None:
    distinct = {i for _, page in history for i in page}
    cursors = {c for c, _ in history if c is not None}
    # Room for every id in a single bucket: nothing can be forgotten.
    if len(distinct) <= WAYS and len(cursors) <= WAYS:
        assert run(Lineage(), history) == exact(history)


def test_a_repeated_page_is_caught_after_many_more_ids() -> None:
    lineage, first = step_page(Lineage(), "c0", [f"id-{i}" for i in range(50)])
    for page in range(1, 21):  # 1,000 more distinct ids, 50 a page
        lineage, verdict = step_page(lineage, f"c{page}", [f"id-{page}-{i}" for i in range(50)])
        assert verdict.passed
    lineage, again = step_page(lineage, "c0", [f"id-{i}" for i in range(50)])
    assert first.passed and again.reason == "cycle" and again.records_seen == 1050


def test_the_stored_lineage_has_one_size_whatever_the_ids() -> None:
    small, _ = step_page(Lineage(), "a", ["x"])
    big = small
    for page in range(200):
        big, _ = step_page(big, f"c{page}", [f"p{page}-{i}" for i in range(100)])
    assert big.count == 20_001
    for part in ("ids", "cursors"):
        assert len(big.to_doc()[part]) == len(small.to_doc()[part])
    assert len(big.ids.slots) == ID_BUCKETS * WAYS * 8
    assert len(big.cursors.slots) == CURSOR_BUCKETS * WAYS * 8


def test_the_stored_form_reads_back_the_same() -> None:
    lineage, _ = step_page(Lineage(), "a", ["x", "y"])
    again = Lineage.from_doc(lineage.to_doc())
    assert again == lineage
    _, verdict = step_page(again, "a", ["y"])
    assert verdict.reason == "cycle" and verdict.records_seen == 2


def test_an_older_or_damaged_document_forgets_toward_new() -> None:
    old = Lineage.from_doc({"cursors": ["c1"], "ids": ["aa", "bb", "cc"]})
    assert old.count == 3
    _, verdict = step_page(old, "c1", ["aa"])  # forgotten: taken as new, counted again
    assert verdict.passed and verdict.records_seen == 4
    damaged = Lineage.from_doc({"v": 2, "count": 7, "ids": "not base64!", "cursors": 5})
    assert damaged.count == 7 and damaged.ids == SlotTable(ID_BUCKETS)
    assert Lineage.from_doc(None) == Lineage()


def test_has_agrees_with_adding() -> None:
    table, fresh = SlotTable(4).adding(["a", "b", "a"])
    assert fresh == 2 and table.has("a") and table.has("b") and not table.has("c")
    assert not SlotTable(4).has("a")
