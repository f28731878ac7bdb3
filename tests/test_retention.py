"""Retention: every record expires; the SQLite store stays bounded under a long run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SECRET, Api, Clock
from sidecar.app import create_app
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


def test_sqlite_stays_bounded_under_a_long_synthetic_run(tmp_path: Path) -> None:
    """5,000 decisions at one per second with two-minute retentions: the
    automatic sweep keeps the row count flat instead of growing with the run."""
    clock = Clock()
    store = SQLiteStore(tmp_path / "loopstop.db", clock=clock)
    app = create_app(
        {"store": f"sqlite:///{tmp_path}/loopstop.db", **SHORT},
        environ={"LOOPSTOP_SECRET": SECRET},
        clock=clock,
        store=store,
    )
    api = Api(app.test_client(), token=None)
    sizes = {}
    for i in range(5000):
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
        if i in (2499, 4999):
            sizes[i] = store.row_count()
    print(f"rows after 2,500 decisions: {sizes[2499]}, after 5,000: {sizes[4999]}")
    assert sizes[4999] <= sizes[2499] * 1.2
    assert sizes[4999] < 2000  # ~ what two minutes of traffic leave, not 5,000 x 3


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
