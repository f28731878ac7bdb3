"""Redis: a decision on a guess (``recent_likely``) stands only on what the
compare-and-set compared, the keys its plan leaves unchecked included; when
one of those moved, the script's answer is the read and the decision is made
again on it, with them unchecked as usual."""

from __future__ import annotations

import pytest

from conftest import RedisServer
from sidecar.store import Plan, Snapshot, StoreEvents, Write
from sidecar.store.redis import RedisStore

pytestmark = pytest.mark.redis


def _store(redis_server: RedisServer, trips: list[int]) -> RedisStore:
    redis_server.client().flushdb()
    return RedisStore(redis_server.url, events=StoreEvents(round_trip=lambda: trips.append(1)))


def _decide(snap: Snapshot) -> Plan[int]:
    """Write the task's document, reading a total it tolerates moving."""
    total = (snap.get("totals") or {}).get("n", 0)
    task = snap.get("task") or {"calls": 0}
    plan = Plan(total, {"task": Write({"calls": task["calls"] + 1})}, unchecked={"totals"})
    return plan


def test_a_guess_compares_the_unchecked_keys_and_saves_the_read(
    redis_server: RedisServer,
) -> None:
    trips: list[int] = []
    store = _store(redis_server, trips)
    redis_server.client().set("loopstop:totals", '{"n":3}')
    assert store.transact(["task", "totals"], _decide) == 3  # read, then write: two
    assert len(trips) == 2
    trips.clear()
    assert store.transact(["task", "totals"], _decide, recent_likely=True) == 3
    assert len(trips) == 1  # decided on what this process saw, and compared whole
    assert store.get("task") == {"calls": 2}
    store.close()


def test_an_unchecked_key_that_moved_is_decided_again_on_the_answer(
    redis_server: RedisServer,
) -> None:
    trips: list[int] = []
    store = _store(redis_server, trips)
    client = redis_server.client()
    client.set("loopstop:totals", '{"n":3}')
    assert store.transact(["task", "totals"], _decide) == 3
    client.set("loopstop:totals", '{"n":4}')  # another worker ended a task
    trips.clear()
    assert store.transact(["task", "totals"], _decide, recent_likely=True) == 4
    assert len(trips) == 2  # the script's answer was the read
    assert store.get("task") == {"calls": 2}
    store.close()
