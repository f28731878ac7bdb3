"""A store emptied and given a new identity while a store object remembers
values: that object decides nothing until accepted."""

from __future__ import annotations

import pytest

from conftest import PostgresServer, RedisServer
from sidecar.errors import LoopstopError
from sidecar.store import Plan, Snapshot, Write, store_from_url

pytestmark = pytest.mark.security


def _bump(snap: Snapshot) -> Plan[int]:
    n = (snap.get("op") or {"n": 0})["n"]
    return Plan(n + 1, {"op": Write({"n": n + 1})})


def _run(url: str, empty) -> None:  # type: ignore[no-untyped-def]
    a = store_from_url(url)
    a.ensure_schema()
    assert a.transact(["op"], _bump, absent_likely=True) == 1
    assert a.transact(["op"], _bump, recent_likely=True) == 2
    empty()
    b = store_from_url(url)
    b.ensure_schema()
    assert b.transact(["op"], _bump) == 1
    assert b.transact(["op"], _bump) == 2
    for kw in ({"recent_likely": True}, {"absent_likely": True}, {}):
        with pytest.raises(LoopstopError):
            a.transact(["op"], _bump, **kw)
    assert b.get("op") == {"n": 2}
    a.close()
    b.close()


@pytest.mark.postgres
def test_postgres_reset_under_memory(postgres_server: PostgresServer) -> None:
    postgres_server.reset()
    _run(postgres_server.url, postgres_server.reset)


@pytest.mark.redis
def test_redis_flushed_under_memory(redis_server: RedisServer) -> None:
    redis_server.client().flushdb()
    _run(redis_server.url, lambda: redis_server.client().flushdb())
