"""PostgreSQL: a transaction on keys that are probably new (``absent_likely``,
a first begin) decides on "absent" and locks, compares and writes in one
pipeline (one round trip); when a key is there, nothing is written and the
decision is made again on what that pipeline read first: a replay, which
writes nothing, is answered in that one round trip too."""

from __future__ import annotations

import pytest

from conftest import PostgresServer
from sidecar.store import Plan, Snapshot, StoreEvents, Write
from sidecar.store.base import TxnFn
from sidecar.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def _reserve(snap: Snapshot) -> Plan[str]:
    """Reserve ``op`` if absent, else answer what is there (a begin's shape)."""
    if snap.get("op") is None:
        return Plan("new", {"op": Write({"n": 1})})
    return Plan("replay")


def _raising(key: str) -> TxnFn[str]:
    def fn(snap: Snapshot) -> Plan[str]:
        if snap.get(key) is None:
            raise LookupError(f"no {key}")  # raised on the guess: not the answer
        return Plan("found")

    return fn


def test_absent_guess_and_its_replay_are_one_round_trip_each(
    postgres_server: PostgresServer,
) -> None:
    postgres_server.reset()
    trips: list[int] = []
    store = PostgresStore(
        postgres_server.url, events=StoreEvents(round_trip=lambda: trips.append(1))
    )
    store.ensure_schema()
    try:
        trips.clear()
        assert store.transact(["op", "stop"], _reserve, absent_likely=True) == "new"
        assert len(trips) == 1
        trips.clear()
        assert store.transact(["op", "stop"], _reserve, absent_likely=True) == "replay"
        assert len(trips) == 1
        assert store.get("op") == {"n": 1}
        assert store.transact(["op"], _raising("op"), absent_likely=True) == "found"
        with pytest.raises(LookupError):  # raised on what is stored: the answer
            store.transact(["other"], _raising("other"), absent_likely=True)
    finally:
        store.close()


def _bump(snap: Snapshot) -> Plan[int]:
    """Add one to ``n`` (a commit after its begin, a result after its call)."""
    n = (snap.get("op") or {"n": 0})["n"]
    return Plan(n + 1, {"op": Write({"n": n + 1})})


def test_recent_guess_is_one_round_trip_and_a_changed_key_is_decided_again(
    postgres_server: PostgresServer,
) -> None:
    """``recent_likely``: decided on what this store object last read or wrote,
    compared in the commit pipeline; another writer's change in between is
    seen (the decision is made again on it), never overwritten."""
    postgres_server.reset()
    trips: list[int] = []
    store = PostgresStore(
        postgres_server.url, events=StoreEvents(round_trip=lambda: trips.append(1))
    )
    other = PostgresStore(postgres_server.url)
    store.ensure_schema()
    try:
        assert store.transact(["op"], _bump, absent_likely=True) == 1
        trips.clear()
        assert store.transact(["op"], _bump, recent_likely=True) == 2
        assert len(trips) == 1
        assert other.transact(["op"], _bump) == 3  # another worker
        trips.clear()
        assert store.transact(["op"], _bump, recent_likely=True) == 4
        assert len(trips) == 2  # the guess lost; decided on the read that pipeline made
        assert other.get("op") == {"n": 4}
    finally:
        store.close()
        other.close()
