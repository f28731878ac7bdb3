"""A plan decided on a guess, with a bound on counters it leaves unchecked
(:class:`~sidecar.store.Bound`): the store checks the counters against the
bound, not whole. A counter that moved but stays within the bound does not
fail the guess; one past it does, and the decision is made again on what is
stored. SQLite reads inside its write lock and never guesses: the decision
is always made on the stored counts."""

from __future__ import annotations

import pytest

from sidecar.store import (
    Bound,
    Increment,
    Plan,
    Snapshot,
    Store,
    StoreEvents,
    Write,
    store_from_url,
)

pytestmark = pytest.mark.all_stores

LIMIT = 10


def _count(snap: Snapshot, key: str) -> int:
    doc = snap.get(key)
    return int(doc["count"]) if doc else 0


def _admit(snap: Snapshot) -> Plan[str]:
    """An activation's shape: admit the event while ``prev * 0.5 + cur`` is
    under :data:`LIMIT` (then count it), refuse it otherwise."""
    estimate = _count(snap, "prev") * 0.5 + _count(snap, "cur")
    snap.get("event")
    weights = (0.5, 1.0)
    if estimate < LIMIT:
        plan = Plan(
            "admitted",
            {"event": Write({"seen": True})},
            increments={"cur": Increment("count", 1)},
            unchecked={"prev", "cur"},
            bounds=[Bound(("prev", "cur"), weights, "count", below=LIMIT)],
        )
        return plan
    return Plan(
        "refused",
        unchecked={"prev", "cur"},
        bounds=[Bound(("prev", "cur"), weights, "count", at_least=LIMIT)],
    )


def _open(store_url: str, trips: list[int]) -> Store:
    s = store_from_url(store_url, events=StoreEvents(round_trip=lambda: trips.append(1)))
    s.ensure_schema()
    return s


def _set_counts(other: Store, prev: int | None, cur: int | None) -> None:
    """What other workers counted (another store object: this one's recent
    values never see it)."""

    def put(snap: Snapshot) -> Plan[None]:
        writes = {}
        for key, n in (("prev", prev), ("cur", cur)):
            snap.get(key)
            writes[key] = Write(None if n is None else {"count": n})
        return Plan(None, writes)

    other.transact(["prev", "cur"], put)


def _guessed(store: Store) -> str:
    return store.transact(["event", "prev", "cur"], _admit, absent_likely=True, recent_likely=True)


def test_counters_moved_within_the_bound_leave_the_guess_standing(store_url: str) -> None:
    trips: list[int] = []
    store, other = _open(store_url, trips), _open(store_url, [])
    try:
        _set_counts(other, prev=8, cur=5)  # 8 * 0.5 + 5 = 9: still under 10
        trips.clear()
        assert _guessed(store) == "admitted"
        if not store_url.startswith("sqlite"):
            assert len(trips) == 1  # guessed absent, checked by the bound, written
        assert store.get("cur") == {"count": 6}
        assert store.get("event") == {"seen": True}
    finally:
        store.close()
        other.close()


def test_counters_past_the_bound_are_decided_again_on_what_is_stored(store_url: str) -> None:
    store, other = _open(store_url, []), _open(store_url, [])
    try:
        _set_counts(other, prev=12, cur=5)  # 12 * 0.5 + 5 = 11: over
        assert _guessed(store) == "refused"  # the guess (absent: 0) admitted
        assert store.get("cur") == {"count": 5}  # nothing counted
        assert store.get("event") is None
        _set_counts(other, prev=None, cur=3)  # a new window
        assert _guessed(store) == "admitted"
        assert store.get("cur") == {"count": 4}
    finally:
        store.close()
        other.close()


def test_a_refusal_guessed_on_counts_that_fell_is_decided_again(store_url: str) -> None:
    store, other = _open(store_url, []), _open(store_url, [])
    try:
        _set_counts(other, prev=None, cur=10)
        assert _guessed(store) == "refused"  # on the stored counts: this object remembers them
        _set_counts(other, prev=None, cur=2)  # the counter expired and began again
        assert _guessed(store) == "admitted"  # a guess of 10 refused; the bound said otherwise
        assert store.get("cur") == {"count": 3}
    finally:
        store.close()
        other.close()


def test_a_plan_refuses_a_bound_it_could_not_check() -> None:
    bound = Bound(("a",), (1.0,), "count", below=1)
    with pytest.raises(RuntimeError, match="compares whole"):
        Plan(None, {"b": Write({})}, bounds=[bound]).check()
    with pytest.raises(RuntimeError, match="one weight per key"):
        Plan(None, unchecked={"a", "c"}, bounds=[Bound(("a", "c"), (1.0,), "n", 1)]).check()
