"""Fail closed: a store that cannot answer gives 503 problem+json, and no
``execute`` or ``proceed`` is ever returned without a stored record."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conftest import SECRET, Api, Clock, RedisServer
from sidecar.app import create_app
from sidecar.store import store_from_url


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
        time.sleep(0.4)
        server.stop("kill")
        killed_at = len(results)
        time.sleep(0.6)
        during = len(results) - killed_at
        server.start()
        time.sleep(0.6)
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
