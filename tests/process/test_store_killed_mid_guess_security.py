"""A store killed (SIGKILL) while two store objects decide on guesses, then
restarted: only StoreUnavailable while it is down, no update lost or doubled."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PostgresServer, RedisServer
from sidecar.errors import StoreUnavailable
from sidecar.store import Plan, Snapshot, Write, store_from_url

pytestmark = [pytest.mark.slow, pytest.mark.security]

LIMIT = 10**9


def _bump(snap: Snapshot) -> Plan[int]:
    n = (snap.get("op") or {"n": 0})["n"]
    if n >= LIMIT:
        return Plan(-1)
    return Plan(n + 1, {"op": Write({"n": n + 1, "pad": "x" * 50})})


def _hammer(url: str, kill: Any, start: Any) -> None:
    stores = [store_from_url(url + ("&" if "?" in url else "?") + "") for _ in range(2)]
    stores = [store_from_url(url) for _ in range(2)]
    for s in stores:
        s.timeout_s = 1.0
        s.ensure_schema()
    oks: list[int] = []
    errors: list[BaseException] = []
    unknown = 0
    stop = threading.Event()
    lock = threading.Lock()

    def worker(i: int) -> None:
        nonlocal unknown
        store = stores[i % 2]
        first = True
        while not stop.is_set():
            try:
                n = store.transact(["op"], _bump, absent_likely=first, recent_likely=not first)
                first = False
                with lock:
                    oks.append(n)
            except StoreUnavailable:
                with lock:
                    unknown += 1
                time.sleep(0.01)
            except BaseException as exc:  # anything else would be a 500
                with lock:
                    errors.append(exc)
                time.sleep(0.01)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.7)
    kill()
    time.sleep(0.5)
    start()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    final = None
    for _ in range(50):
        try:
            final = (stores[0].get("op") or {"n": 0})["n"]
            break
        except StoreUnavailable:
            time.sleep(0.1)
    for s in stores:
        s.close()
    assert not errors, [repr(e) for e in errors[:5]]
    assert len(set(oks)) == len(oks), "two decisions returned the same count: a lost update"
    assert final is not None and max(oks) <= final <= len(oks) + unknown
    assert len(oks) > 20


def test_postgres_killed_mid_guesses(tmp_path: Path) -> None:
    server = PostgresServer().start()
    try:
        _hammer(server.url, lambda: server.stop("kill"), server.start)
    finally:
        server.cleanup()


def test_redis_killed_mid_guesses(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r", "--appendonly", "yes", "--appendfsync", "always").start()
    try:
        _hammer(server.url, lambda: server.stop("kill"), server.start)
    finally:
        server.stop()
