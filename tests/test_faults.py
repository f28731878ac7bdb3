"""Faults: a killed Redis keeps every committed record, a killed worker never
leads to a second execute, a killed SQLite writer leaves a consistent file,
and the begin race holds at volume."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from test_serve import Sidecar

from conftest import SECRET, Api, RedisServer
from sidecar.app import create_app

pytestmark = pytest.mark.slow


def test_redis_killed_after_commits_keeps_every_committed_operation(tmp_path: Path) -> None:
    server = RedisServer(
        tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "always"
    ).start()
    try:
        api = Api(
            create_app({"store": server.url}, environ={"LOOPSTOP_SECRET": SECRET}).test_client(),
            token=None,
        )
        for i in range(200):
            api.begin(f"op-{i}", {"i": i})
            status, _ = api.post(
                f"/v1/operations/op-{i}/commit", {"attempt": 1, "receipt": f"r-{i}"}
            )
            assert status == 200
        server.stop("kill")
        server.start()
        replays = [api.begin(f"op-{i}", {"i": i}) for i in range(200)]
        assert all(r["decision"] == "replay" for r in replays)
        assert [r["operation"]["receipt"] for r in replays] == [f"r-{i}" for i in range(200)]
    finally:
        server.stop()


def _worker_pids(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_worker_killed_between_begin_and_commit_is_never_re_executed(
    tmp_path: Path, sidecar_env: dict[str, str]
) -> None:
    served = Sidecar(
        tmp_path,
        {"LOOPSTOP_STORE": sidecar_env["LOOPSTOP_STORE"], "LOOPSTOP_SECRET": SECRET},
        workers=2,
    ).start()
    try:
        base = f"{served.base}/v1/operations/crash-1"
        r = requests.post(f"{base}/begin", json={"payload": {"x": 1}, "lease_s": 1}, timeout=10)
        assert r.json()["decision"] == "execute"
        assert served.proc is not None
        for pid in _worker_pids(served.proc.pid):  # the flow's write never reports back
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.5)  # gunicorn restarts the workers; the lease (1 s) runs out
        decisions = set()
        deadline = time.monotonic() + 20
        while len(decisions) < 1 and time.monotonic() < deadline:
            try:
                r = requests.post(f"{base}/begin", json={"payload": {"x": 1}}, timeout=5)
                decisions.add(r.json()["decision"])
            except requests.ConnectionError:
                time.sleep(0.2)
        for _ in range(5):
            r = requests.post(f"{base}/begin", json={"payload": {"x": 1}}, timeout=5)
            decisions.add(r.json()["decision"])
        assert decisions == {"reconcile"}
        assert requests.get(base, timeout=5).json()["operation"]["state"] == "unknown"
    finally:
        served.stop()


WRITER = """
import sys
from sidecar.store.sqlite import SQLiteStore
from sidecar.store import Plan, Write
store = SQLiteStore(sys.argv[1])
i = 0
while True:
    key = f"k{i}"
    store.transact([key, "counter"], lambda snap, key=key: Plan(None, {
        key: Write({"i": i, "pad": "x" * 2000}),
        "counter": Write({"n": i}),
    }))
    print(i, flush=True)
    i += 1
"""


def test_sqlite_writer_killed_mid_transaction_leaves_a_consistent_file(tmp_path: Path) -> None:
    db = tmp_path / "loopstop.db"
    acknowledged = -1
    for _round in range(5):
        with subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stdout is not None
            for _ in range(40 + 37 * _round):
                acknowledged = max(acknowledged, int(proc.stdout.readline()))
            proc.send_signal(signal.SIGKILL)  # wherever it is: often inside a transaction
            proc.wait()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        keys = {row[0] for row in conn.execute("SELECT key FROM kv")}
    # Every transaction the writer saw commit is there (each round restarts at k0).
    assert {f"k{i}" for i in range(acknowledged + 1)} <= keys


def test_begin_race_at_volume_across_four_workers(
    tmp_path: Path, sidecar_env: dict[str, str]
) -> None:
    served = Sidecar(
        tmp_path,
        {"LOOPSTOP_STORE": sidecar_env["LOOPSTOP_STORE"], "LOOPSTOP_SECRET": SECRET},
        workers=4,
    ).start()
    begins = int(os.environ.get("LOOPSTOP_RACE_BEGINS", "2000"))
    try:
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).parent.parent / "bench" / "race.py"),
                "--url",
                served.base,
                "--begins",
                str(begins),
                "--ids",
                "200",
                "--clients",
                "32",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        served.stop()
    store = sidecar_env["LOOPSTOP_STORE"].split(":", 1)[0]
    print(f"{store}: {out.stdout.strip()}")
    assert out.returncode == 0, out.stdout + out.stderr
