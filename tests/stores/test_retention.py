"""Retention: every record expires; the SQLite and PostgreSQL stores stay bounded
under a long run (their periodic sweeps) and ``loopstop purge`` empties them of
expired records."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from conftest import SECRET, Api, Clock, PostgresServer
from sidecar.app import create_app
from sidecar.store.postgres import PostgresStore
from sidecar.store.sqlite import SQLiteStore

SHORT = {
    "chains": {
        "default": {
            "dedupe_window_s": 60,
            "rate_window_s": 60,
            "chain_ttl_s": 120,
            "workflow_rate_window_s": 60,
        }
    },
    "operations": {"retention_s": 120},
    "tasks": {"retention_s": 120},
}


def _run_decisions(
    api: Api, clock: Clock, count: int, sizes_at: set[int], store: SQLiteStore | PostgresStore
) -> dict[int, int]:
    """``count`` decisions at one per second (activations, begin+commit in turn);
    the store's row count after each decision in ``sizes_at``."""
    sizes = {}
    for i in range(count):
        if i % 2:
            api.post(
                "/v1/activations",
                {
                    "workflow": "wf",
                    "event_key": f"e{i}",
                    "subject_key": f"s{i % 50}",
                    "content": {"i": i},
                },
            )
        else:
            api.begin(f"op-{i}", {"i": i})
            api.post(f"/v1/operations/op-{i}/commit", {"attempt": 1, "receipt": i})
        clock.advance(1)
        if i in sizes_at:
            sizes[i] = store.row_count()
    return sizes


@pytest.mark.slow  # 1,500 decisions: seconds
def test_sqlite_stays_bounded_under_a_long_synthetic_run(tmp_path: Path) -> None:
    """1,500 decisions at one per second with two-minute retentions (the steady
    state comes after 120; the sweep runs every 50 transactions): the automatic
    sweep keeps the row count flat instead of growing with the run."""
    clock = Clock()
    store = SQLiteStore(tmp_path / "loopstop.db", clock=clock)
    app = create_app(
        {"store": f"sqlite:///{tmp_path}/loopstop.db", **SHORT},
        environ={"LOOPSTOP_SECRET": SECRET},
        clock=clock,
        store=store,
    )
    api = Api(app.test_client(), token=None)
    sizes = _run_decisions(api, clock, 1500, {749, 1499}, store)
    print(f"rows after 750 decisions: {sizes[749]}, after 1,500: {sizes[1499]}")
    assert sizes[1499] <= sizes[749] * 1.2
    assert sizes[1499] < 1000  # ~ what two minutes of traffic leave, not 1,500 x 3


@pytest.mark.slow  # runs the CLI in a process
def test_purge_deletes_every_expired_record(tmp_path: Path) -> None:
    clock = Clock()
    db = tmp_path / "loopstop.db"
    store = SQLiteStore(db, clock=clock, sweep_every=0)
    app = create_app(
        {"store": f"sqlite:///{db}", **SHORT},
        environ={"LOOPSTOP_SECRET": SECRET},
        clock=clock,
        store=store,
    )
    api = Api(app.test_client(), token=None)
    for i in range(300):
        api.post("/v1/activations", {"workflow": "wf", "event_key": f"e{i}", "content": {"i": i}})
    assert store.row_count() > 300
    # The command reads the real clock: move every deadline into the past.
    store._conn().execute("UPDATE kv SET expires_at = 1 WHERE expires_at IS NOT NULL")
    env = {
        "PATH": os.environ["PATH"],
        "LOOPSTOP_SECRET": SECRET,
        "LOOPSTOP_STORE": f"sqlite:///{db}",
    }
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "purge", "--vacuum"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "purged" in out.stdout
    assert store.row_count() == 0  # activations keep nothing without a TTL


def _expired_rows(url: str, now: float) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM loopstop_kv WHERE expires_at IS NOT NULL AND expires_at <= %s",
            (now,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _postgres_app(
    postgres_server: PostgresServer, sweep_interval_s: float
) -> tuple[Clock, PostgresStore, Api]:
    """An emptied PostgreSQL store sweeping every ``sweep_interval_s`` seconds,
    its clock and an app over it with short retentions."""
    postgres_server.reset()
    clock = Clock()
    store = PostgresStore(f"{postgres_server.url}?sweep_interval_s={sweep_interval_s}", clock=clock)
    app = create_app(
        {"store": postgres_server.url, **SHORT},
        environ={"LOOPSTOP_SECRET": SECRET},
        clock=clock,
        store=store,
    )
    return clock, store, Api(app.test_client(), token=None)


def test_postgres_stays_bounded_by_its_periodic_sweep(postgres_server: PostgresServer) -> None:
    """900 decisions at one per second with two-minute retentions on PostgreSQL,
    no ``purge``: the sweep that runs after a decision once ``sweep_interval_s``
    has passed keeps the row count flat and leaves no expired row behind."""
    clock, store, api = _postgres_app(postgres_server, sweep_interval_s=0.001)
    sizes = _run_decisions(api, clock, 900, {449, 899}, store)
    print(f"postgres rows after 450 decisions: {sizes[449]}, after 900: {sizes[899]}")
    assert sizes[899] <= sizes[449] * 1.2
    assert sizes[899] < 1000  # ~ what two minutes of traffic leave, not 900 x 3
    time.sleep(0.01)
    api.begin("one-more", {"i": -1})  # the sweep runs after this decision
    assert _expired_rows(postgres_server.url, clock.now) == 0
    store.close()


def test_postgres_purge_deletes_every_expired_record(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Expired rows stay until the sweep's interval has passed (an hour here), and
    ``loopstop purge`` deletes every one of them at once."""
    clock, store, api = _postgres_app(postgres_server, sweep_interval_s=3600)
    for i in range(300):
        api.post("/v1/activations", {"workflow": "wf", "event_key": f"e{i}", "content": {"i": i}})
    rows = store.row_count()
    assert rows > 300
    clock.advance(86400)  # every record has expired, for the store's clock
    api.post("/v1/activations", {"workflow": "wf", "event_key": "late", "content": {}})
    assert _expired_rows(postgres_server.url, clock.now) >= rows  # not swept within the hour
    # The command reads the real clock: move every deadline into the past.
    with psycopg.connect(postgres_server.url) as conn:
        expiring = conn.execute(
            "UPDATE loopstop_kv SET expires_at = 1 WHERE expires_at IS NOT NULL"
        ).rowcount
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "purge"],
        env={
            "PATH": os.environ["PATH"],
            "LOOPSTOP_SECRET": SECRET,
            "LOOPSTOP_STORE": postgres_server.url,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    print(out.stdout.strip())
    assert f"purged {expiring} expired record(s)" in out.stdout, out.stdout
    assert store.row_count() == 0  # activations keep nothing without a TTL
    store.close()
