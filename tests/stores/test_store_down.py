"""Fail closed: a store that cannot answer gives 503 problem+json, and no
``execute`` or ``proceed`` is ever returned without a stored record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from conftest import SECRET, Api, Clock, PostgresServer, RedisServer, wait_until
from sidecar.app import create_app
from sidecar.store import store_from_url

pytestmark = pytest.mark.slow  # it starts and stops its own Redis and PostgreSQL servers


def test_redis_stopped_under_load_fails_closed_and_recovers(tmp_path: Path) -> None:
    server = RedisServer(
        tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "always"
    ).start()
    try:
        app = create_app({"store": server.url}, environ={"LOOPSTOP_SECRET": SECRET}, clock=Clock())
        results: list[tuple[str, int, Any]] = []
        lock = threading.Lock()
        stop = threading.Event()

        setup = Api(app.test_client(), token=None)
        status, created = setup.post(
            "/v1/tasks", {"workflow": "wf", "limits": {"max_tool_calls": 100_000}}
        )
        assert status == 201
        task_id = created["task"]["task_id"]
        activations: list[tuple[int, Any]] = []
        tool_calls: list[tuple[int, Any]] = []

        def worker(n: int) -> None:
            api = Api(app.test_client(), token=None)
            i = 0
            while not stop.is_set():
                op_id = f"w{n}-{i}"
                i += 1
                status, body = api.post(f"/v1/operations/{op_id}/begin", {"payload": {"i": i}})
                with lock:
                    results.append((op_id, status, body))
                # Two threads also activate fresh events and call tools (60 calls
                # each at most: every admitted call stays in the task's history).
                if n % 4 == 1 and i <= 60:
                    answer = api.post(
                        "/v1/activations",
                        {"workflow": "wf", "event_key": f"e{n}-{i}", "content": {"i": i}},
                    )
                    call = api.post(
                        f"/v1/tasks/{task_id}/tool-calls",
                        {"tool": "search", "kind": "read", "args": {"n": n, "i": i}},
                    )
                    with lock:
                        activations.append(answer)
                        tool_calls.append(call)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        wait_until(
            lambda: len(results) >= 16 and len(activations) >= 2, "decisions before the outage"
        )
        server.stop("kill")
        killed_at = len(results)
        wait_until(  # the outage is seen by every kind of decision
            lambda: (
                any(s == 503 for _, s, _ in results[killed_at:])
                and any(s == 503 for s, _ in activations)
                and any(s == 503 for s, _ in tool_calls)
            ),
            "503s during the outage",
        )
        during = len(results) - killed_at
        server.start()
        restarted_at = len(results)
        wait_until(  # every thread decides again
            lambda: (
                {op.split("-")[0] for op, s, _ in results[restarted_at:] if s == 200}
                == {f"w{n}" for n in range(8)}
            ),
            "decisions on every thread after the restart",
        )
        stop.set()
        for t in threads:
            t.join()

        statuses = {s for _, s, _ in results}
        assert statuses <= {200, 503}, statuses
        failed = [(op, b) for op, s, b in results if s == 503]
        assert during > 0 and failed, "the outage was not observed"
        for _, body in failed:
            assert body["type"].endswith("store-unavailable") and body["status"] == 503
        executed = [op for op, s, b in results if s == 200 and b["decision"] == "execute"]
        assert results[-1][1] == 200, "service did not resume after Redis came back"
        store = store_from_url(server.url)
        docs = store.get_many([f"p:op:{op}" for op in executed])
        missing = [op for op in executed if docs[f"p:op:{op}"] is None]
        assert not missing, f"execute returned without a stored record: {missing[:5]}"
        # Activations and tool calls fail closed the same way: 503 problem+json
        # during the outage, and every proceed / execute is on record.
        for status, body in activations + tool_calls:
            assert status == 200 or (
                status == 503 and body["type"].endswith("store-unavailable")
            ), (status, body)
        assert any(s == 503 for s, _ in activations) and any(s == 503 for s, _ in tool_calls)
        proceeded = [b for s, b in activations if s == 200 and b["decision"] == "proceed"]
        assert proceeded
        chains = store.get_many([f"p:chain:{b['chain_id']}" for b in proceeded])
        assert all(doc is not None for doc in chains.values()), "proceed without a chain record"
        task = store.get(f"p:task:{task_id}")
        assert task is not None
        recorded = {c["call_id"] for c in task["calls"]}
        admitted = [b["call_id"] for s, b in tool_calls if s == 200 and b["decision"] == "execute"]
        assert admitted and set(admitted) <= recorded, "execute without a recorded call"
        store.close()
        api = Api(app.test_client(), token=None)
        assert api.get("/readyz")[0] == 200
    finally:
        server.stop()


def test_redis_down_readyz_and_reads_are_503(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    app = create_app({"store": server.url}, environ={"LOOPSTOP_SECRET": SECRET})
    api = Api(app.test_client(), token=None)
    api.begin("o")
    server.stop()
    for status, body in (
        api.get("/readyz"),
        api.get("/v1/operations/o"),
        api.post("/v1/operations/o/commit", {"attempt": 1, "receipt": 1}),
        api.get("/v1/operations"),
    ):
        assert status == 503 and body["type"].endswith("store-unavailable")
        assert str(server.port) not in body["detail"] and "redis://" not in body["detail"]
    assert api.get("/healthz")[0] == 200  # liveness does not depend on the store


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def test_sqlite_locked_past_busy_timeout_is_503_not_a_hang(tmp_path: Path) -> None:
    db = tmp_path / "loopstop.db"
    url = f"sqlite:///{db}?busy_timeout_s=0.3"
    app = create_app({"store": url}, environ={"LOOPSTOP_SECRET": SECRET})
    api = Api(app.test_client(), token=None)
    api.begin("before")
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(db), "3"], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        status, body = api.post("/v1/operations/during/begin", {"payload": 1})
        elapsed = time.monotonic() - started
        assert status == 503 and body["type"].endswith("store-unavailable"), body
        assert elapsed < 2.0
    assert api.get("/v1/operations/during")[0] == 404  # nothing was admitted
    assert api.begin("during")["decision"] == "execute"
    assert api.begin("before")["decision"] == "in_progress"


def test_redis_evicting_policy_is_not_ready_and_every_decision_is_503(tmp_path: Path) -> None:
    """A Redis whose maxmemory-policy is not noeviction could evict committed
    records (a re-begin would then execute again): not ready, and every
    decision is a 503 naming the policy, checked again as CONFIG SET changes it."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        app = create_app(
            {"store": server.url, "redis": {"policy_check_s": 0.2}},
            environ={"LOOPSTOP_SECRET": SECRET},
        )
        api = Api(app.test_client(), token=None)
        assert api.begin("before")["decision"] == "execute"
        server.client().config_set("maxmemory-policy", "volatile-lru")
        time.sleep(0.3)
        answers = [
            api.post("/v1/operations/after/begin", {"payload": 1}),
            api.post("/v1/operations/before/begin", {"payload": {"x": 1}}),
            api.post("/v1/activations", {"workflow": "wf", "event_key": "e1", "content": {}}),
            api.get("/readyz"),
        ]
        for status, body in answers:
            assert status == 503 and body["type"].endswith("store-unavailable"), body
            assert "volatile-lru" in body["detail"]
        server.client().config_set("maxmemory-policy", "noeviction")
        time.sleep(0.3)
        assert api.get("/readyz")[0] == 200
        assert api.begin("after", 1)["decision"] == "execute"
    finally:
        server.stop()


def test_redis_started_with_an_evicting_policy_decides_nothing(tmp_path: Path) -> None:
    """The policy is checked at start too: a Redis that was already evicting
    when the sidecar came up is not ready, and no decision is made on it."""
    server = RedisServer(
        tmp_path / "redis", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"
    ).start()
    try:
        app = create_app(
            {"store": server.url, "redis": {"policy_check_s": 0.2}},
            environ={"LOOPSTOP_SECRET": SECRET},
        )
        api = Api(app.test_client(), token=None)
        for status, body in (
            api.get("/readyz"),
            api.post("/v1/operations/o/begin", {"payload": 1}),
            api.post("/v1/activations", {"workflow": "wf", "event_key": "e1", "content": {}}),
            api.post("/v1/tasks", {"workflow": "wf"}),
        ):
            assert status == 503 and body["type"].endswith("store-unavailable"), body
            assert "allkeys-lru" in body["detail"] and str(server.port) not in body["detail"]
        assert not server.client().keys("p:*")  # nothing was written
        server.client().config_set("maxmemory-policy", "noeviction")
        time.sleep(0.3)
        assert api.get("/readyz")[0] == 200
        assert api.begin("o", 1)["decision"] == "execute"
    finally:
        server.stop()


def _accept_store(store_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "accept-store", "--yes"],
        env={**os.environ, "LOOPSTOP_STORE": store_url, "LOOPSTOP_SECRET": SECRET},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_redis_restarted_empty_is_refused_until_accepted(tmp_path: Path) -> None:
    """A non-persistent Redis killed and restarted empty on its port: no
    committed id executes again; every decision and /readyz are 503 until
    `loopstop accept-store`, after which the worker serves again unrestarted."""
    server = RedisServer(tmp_path / "redis").start()  # no AOF, no RDB: restarts empty
    try:
        app = create_app({"store": server.url}, environ={"LOOPSTOP_SECRET": SECRET})
        api = Api(app.test_client(), token=None)
        for i in range(10):
            assert api.begin(f"op-{i}", {"i": i})["decision"] == "execute"
            assert api.post(f"/v1/operations/op-{i}/commit", {"attempt": 1, "receipt": i})[0] == 200
        server.stop("kill")
        server.start()
        for i in range(10):
            status, body = api.post(f"/v1/operations/op-{i}/begin", {"payload": {"i": i}})
            assert status == 503 and body["type"].endswith("store-unavailable"), body
            assert "accept-store" in body["detail"]
        assert api.get("/readyz")[0] == 503
        assert api.get("/v1/operations/op-0")[0] == 503
        assert server.client().dbsize() == 0  # nothing was written into the empty store
        done = _accept_store(server.url)
        assert done.returncode == 0, done.stderr
        assert "accepted store" in done.stdout and "execute again" in done.stdout
        assert api.get("/readyz")[0] == 200
        assert api.begin("op-0", {"i": 0})["decision"] == "execute"  # what accepting means
    finally:
        server.stop()


def test_replaced_database_is_refused_until_accepted(tmp_path: Path) -> None:
    """A SQLite file swapped for another (an older copy, a fresh file): the
    worker that saw the first store refuses the second until accepted."""
    db = tmp_path / "loopstop.db"
    url = f"sqlite:///{db}"
    app = create_app({"store": url}, environ={"LOOPSTOP_SECRET": SECRET})
    api = Api(app.test_client(), token=None)
    assert api.begin("a")["decision"] == "execute"
    other = tmp_path / "other.db"
    create_app({"store": f"sqlite:///{other}"}, environ={"LOOPSTOP_SECRET": SECRET}).extensions[
        "loopstop"
    ].store.close()  # its last connection checkpoints the file
    app.extensions["loopstop"].store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    other.rename(db)
    status, body = api.post("/v1/operations/a/begin", {"payload": {"x": 1}})
    assert status == 503 and "accept-store" in body["detail"], body
    assert str(tmp_path) not in body["detail"]
    assert _accept_store(url).returncode == 0
    assert api.begin("a")["decision"] == "execute"


def test_emptied_or_replaced_postgres_database_is_refused_until_accepted(
    postgres_server: PostgresServer,
) -> None:
    """The database a worker served from loses loopstop's tables (a fresh database
    in its place), then holds another store's (a database of another deployment):
    each time every decision is refused, naming `loopstop accept-store`, which
    makes the worker serve again unrestarted."""
    from sidecar.store.postgres import PostgresStore

    postgres_server.reset()
    app = create_app({"store": postgres_server.url}, environ={"LOOPSTOP_SECRET": SECRET})
    api = Api(app.test_client(), token=None)
    assert api.begin("a")["decision"] == "execute"
    assert api.post("/v1/operations/a/commit", {"attempt": 1, "receipt": "r"})[0] == 200

    postgres_server.drop()  # emptied: no loopstop table left
    for _ in range(2):
        status, body = api.post("/v1/operations/a/begin", {"payload": {"x": 1}})
        assert status == 503 and "accept-store" in body["detail"], body
    assert api.get("/readyz")[0] == 503
    done = _accept_store(postgres_server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "was empty" in done.stdout
    assert api.get("/readyz")[0] == 200
    assert api.begin("a")["decision"] == "execute"  # what accepting an empty store means

    postgres_server.reset()
    other = PostgresStore(postgres_server.url)
    other.ensure_schema()  # another deployment's store, with its own identity
    other.close()
    status, body = api.post("/v1/operations/a/begin", {"payload": {"x": 1}})
    assert status == 503 and "accept-store" in body["detail"], body
    assert postgres_server.url not in body["detail"]
    assert _accept_store(postgres_server.url).returncode == 0
    assert api.begin("a")["decision"] == "execute"
    app.extensions["loopstop"].store.close()


def test_readyz_probes_a_write_on_redis(tmp_path: Path) -> None:
    """A Redis that answers reads but refuses writes (here: min-replicas-to-write
    with no replica) is not ready; the 503 names neither its URL nor its port."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        app = create_app({"store": server.url}, environ={"LOOPSTOP_SECRET": SECRET})
        api = Api(app.test_client(), token=None)
        assert api.get("/readyz")[0] == 200
        server.client().config_set("min-replicas-to-write", 1)
        assert server.client().ping()  # it still answers
        for status, body in (
            api.get("/readyz"),
            api.post("/v1/operations/x/begin", {"payload": 1}),
        ):
            assert status == 503 and body["type"].endswith("store-unavailable"), body
            assert str(server.port) not in body["detail"] and "redis://" not in body["detail"]
        server.client().config_set("min-replicas-to-write", 0)
        assert api.get("/readyz")[0] == 200
    finally:
        server.stop()


def test_hung_redis_fails_within_one_decision_timeout(tmp_path: Path) -> None:
    """A SIGSTOPped redis-server: the first begin is a 503 after one bounded
    timeout (store_timeout_s, default 2 s), not several stacked ones."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        app = create_app({"store": server.url}, environ={"LOOPSTOP_SECRET": SECRET})
        api = Api(app.test_client(), token=None)
        api.begin("warm")
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, body = api.post("/v1/operations/hung/begin", {"payload": 1})
            elapsed = time.monotonic() - started
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert status == 503 and body["type"].endswith("store-unavailable"), body
        assert 1.5 <= elapsed < 2.8, elapsed
        assert f"{server.port}" not in body["detail"]
    finally:
        server.stop()


def test_hung_postgres_fails_within_one_decision_timeout(tmp_path: Path) -> None:
    """Every PostgreSQL process SIGSTOPped: a 503 at the decision's deadline, and
    the store serves again once the server runs on (no sidecar restart)."""
    server = PostgresServer().start()
    try:
        app = create_app(
            {"store": server.url, "store_timeout_s": 1.0}, environ={"LOOPSTOP_SECRET": SECRET}
        )
        api = Api(app.test_client(), token=None)
        api.begin("warm")
        assert server.proc is not None
        pids = [server.proc.pid, *_children(server.proc.pid)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, body = api.post("/v1/operations/hung/begin", {"payload": 1})
            elapsed = time.monotonic() - started
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert status == 503 and body["type"].endswith("store-unavailable"), body
        assert 0.8 <= elapsed < 1.8, elapsed
        assert f"{server.port}" not in body["detail"]
        deadline = time.monotonic() + 10
        while api.post("/v1/operations/hung/begin", {"payload": 1})[0] != 200:
            assert time.monotonic() < deadline, "postgres did not come back"
            time.sleep(0.1)
        app.extensions["loopstop"].store.close()
    finally:
        server.cleanup()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_readyz_probes_a_write_and_names_no_path(tmp_path: Path) -> None:
    """A SQLite database that cannot be written (read-only, as a read-only
    mount or a full disk leave it) is not ready; the 503 names no path."""
    db = tmp_path / "loopstop.db"
    app = create_app({"store": f"sqlite:///{db}"}, environ={"LOOPSTOP_SECRET": SECRET})
    api = Api(app.test_client(), token=None)
    assert api.get("/readyz")[0] == 200
    store = app.extensions["loopstop"].store
    store._conn().execute("PRAGMA query_only = 1")  # SQLite's own read-only switch
    status, body = api.get("/readyz")
    assert status == 503 and body["type"].endswith("store-unavailable"), body
    assert str(tmp_path) not in body["detail"] and "loopstop.db" not in body["detail"]
    status, body = api.post("/v1/operations/x/begin", {"payload": 1})
    assert status == 503 and str(tmp_path) not in body["detail"]


def test_read_only_postgres_is_not_ready_and_admits_nothing(
    postgres_server: PostgresServer,
) -> None:
    """A database that only reads (a standby, or ``default_transaction_read_only``):
    /readyz is 503 (its probe writes) and a begin is a 503 that stored nothing."""
    import psycopg

    postgres_server.reset()
    app = create_app({"store": postgres_server.url}, environ={"LOOPSTOP_SECRET": SECRET})
    api = Api(app.test_client(), token=None)
    assert api.get("/readyz")[0] == 200
    store = app.extensions["loopstop"].store
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute("ALTER DATABASE postgres SET default_transaction_read_only = on")
    try:
        store.close()  # the next connections open read-only
        status, body = api.get("/readyz")
        assert status == 503 and body["type"].endswith("store-unavailable"), body
        status, body = api.post("/v1/operations/ro/begin", {"payload": 1})
        assert status == 503 and postgres_server.url not in body["detail"], body
    finally:
        with psycopg.connect(postgres_server.url, autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")  # this session writes
            conn.execute("ALTER DATABASE postgres RESET default_transaction_read_only")
    store.close()  # and they open read-write again
    assert api.get("/v1/operations/ro")[0] == 404  # nothing was stored
    store.close()


def test_serve_on_postgres_creates_the_schema_and_refuses_a_newer_one(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """`loopstop serve` on an empty database creates the tables and stamps the
    schema; on a schema newer than the server it refuses to start, saying why."""
    import psycopg
    from served import Sidecar

    from conftest import free_port
    from sidecar.store.base import SCHEMA_VERSION

    postgres_server.drop()  # a fresh database
    env = {"LOOPSTOP_STORE": postgres_server.url, "LOOPSTOP_SECRET": SECRET}
    served = Sidecar(tmp_path, env, workers=1).start()
    try:
        assert requests.get(f"{served.base}/readyz", timeout=5).status_code == 200
    finally:
        served.stop()
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        meta = dict(conn.execute("SELECT key, value FROM loopstop_meta").fetchall())
        assert meta["schema_version"] == str(SCHEMA_VERSION) and len(meta["store_id"]) == 32
        conn.execute(
            "UPDATE loopstop_meta SET value = %s WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--bind", f"127.0.0.1:{free_port()}"],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"schema version {SCHEMA_VERSION + 1} is newer" in out.stderr
