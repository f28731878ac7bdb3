"""SQLite store: the embedded default (one file, WAL, ``BEGIN IMMEDIATE``).

Layout (schema version 1)::

    kv   (key TEXT PRIMARY KEY, doc TEXT JSON, expires_at REAL epoch s | NULL)
    idx  (name TEXT, member TEXT, score REAL, PRIMARY KEY (name, member))
    meta (key TEXT PRIMARY KEY, value TEXT)  -- schema_version, store_id, store_accepted

Each transaction takes SQLite's write lock up front (``BEGIN IMMEDIATE``),
so transactions from every thread and every gunicorn worker process are
serialized by the database itself; readers never block (WAL). A lock held
longer than ``busy_timeout_s`` by someone else is a
:class:`~sidecar.errors.StoreUnavailable` (503), never a hang.
``synchronous=FULL``: a committed ledger record survives a power cut, since
losing one would let a retry repeat a write.

Expired rows are invisible to reads at once and deleted by a bounded sweep
that runs inside every ``sweep_every``-th transaction.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from sidecar.errors import ConfigError
from sidecar.store.base import (
    META_ID,
    Doc,
    Plan,
    Snapshot,
    Store,
    StoreOptions,
    T,
    TxnFn,
    check_parameters,
    decode_doc,
    encode_doc,
)

log = logging.getLogger("loopstop.store")

_DDL = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    expires_at REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_expiry ON kv (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS idx (
    name TEXT NOT NULL,
    member TEXT NOT NULL,
    score REAL NOT NULL,
    PRIMARY KEY (name, member)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_order ON idx (name, score, member);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

#: Expired rows deleted per automatic sweep; a sweep runs every ``sweep_every``
#: transactions, so up to SWEEP_BATCH / sweep_every rows expire per write.
SWEEP_BATCH = 1000


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL, None for any other scheme.

    ``sqlite:///./loopstop.db`` is relative to the working directory,
    ``sqlite:////var/lib/loopstop/loopstop.db`` absolute (SQLAlchemy's form).
    """
    parsed = urlparse(url)
    if parsed.scheme != "sqlite":
        return None
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    return Path(path or "loopstop.db")


class SQLiteStore(Store):
    """The store on one SQLite file, shared safely by threads and processes.

    :param path: the database file (created with its folder if absent).
    :param busy_timeout_s: how long a transaction waits for another
        writer's lock before failing with ``StoreUnavailable``.
    :param clock: wall clock for TTLs, epoch seconds.
    :param sweep_every: run the expired-row sweep every N transactions.
    :raises StoreUnavailable: when the file cannot be opened or initialized.
    """

    backend = "sqlite"
    driver_errors = (sqlite3.Error,)
    schemes = ("sqlite",)

    @classmethod
    def check_url(cls, url: str) -> None:
        """``sqlite:///path[?busy_timeout_s=5]`` (three or four slashes).

        :raises ConfigError: a host in the URL, an unknown or bad parameter.
        """
        if urlparse(url).netloc:
            raise ConfigError(
                [
                    (
                        "store",
                        f"{url!r}: write sqlite:///relative/path.db or "
                        "sqlite:////absolute/path.db (three or four slashes)",
                    )
                ]
            )
        check_parameters(url, {"busy_timeout_s"})

    @classmethod
    def from_url(cls, url: str, options: StoreOptions) -> SQLiteStore:
        """The file's store; it reports no round trips (no network) and no
        conflicts (one writer at a time).

        :raises StoreUnavailable: when the file cannot be opened.
        """
        path = sqlite_path(url)
        assert path is not None
        busy = float(parse_qs(urlparse(url).query).get("busy_timeout_s", ["5"])[-1])
        return cls(path, busy_timeout_s=busy)

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        sweep_every: int = 50,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.clock = clock
        self.sweep_every = sweep_every
        self._local = threading.local()
        # SQLite has one writer; a transaction that finds the file locked polls
        # (its busy handler, unfair under contention) and gives up after
        # busy_timeout_s. A worker serves many requests at once (gthread): its
        # threads queue here instead, so the file sees one writer per process.
        self._writer = threading.RLock()
        self._count = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors():
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_DDL)

    # -- connections -------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, reopened after a fork."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=True,
            )
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            self._local.conn = conn
            self._local.pid = os.getpid()
        return conn

    def _where(self) -> str:
        return str(self.path)

    # -- interface ---------------------------------------------------------

    def transact(
        self,
        keys: Iterable[str],
        fn: TxnFn[T],
        *,
        absent_likely: bool = False,
        recent_likely: bool = False,
    ) -> T:
        del absent_likely  # one local read inside the write lock: nothing to save
        with self._writer:
            return self._transact(keys, fn)

    def _transact(self, keys: Iterable[str], fn: TxnFn[T]) -> T:
        self._guard_identity()
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self.identity is not None:
                self._verify_identity(_meta(conn, META_ID))
            now = self.clock()
            docs: dict[str, Doc | None] = {}

            def load(more: list[str]) -> None:
                docs.update(self._select(conn, [k for k in more if k not in docs], now))

            load(list(dict.fromkeys(keys)))
            plan = fn(Snapshot(docs, load))
            self._apply(conn, plan, docs, now)
            self._count += 1
            if self.sweep_every and self._count % self.sweep_every == 0:
                self._sweep(conn, now)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return plan.committed()

    def get_many(self, keys: Sequence[str]) -> dict[str, Doc | None]:
        self._guard_identity()
        conn = self._conn()
        if self.identity is not None:
            self._verify_identity(_meta(conn, META_ID))
        return self._select(conn, list(dict.fromkeys(keys)), self.clock())

    def index_page(
        self,
        index: str,
        *,
        min_score: float = float("-inf"),
        max_score: float = float("inf"),
        after: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[tuple[str, float]]:
        lo = -1e308 if math.isinf(min_score) else min_score
        hi = 1e308 if math.isinf(max_score) else max_score
        sql = "SELECT member, score FROM idx WHERE name = ? AND score >= ? AND score <= ?"
        args: list[Any] = [index, lo, hi]
        if after is not None:
            sql += " AND (score > ? OR (score = ? AND member > ?))"
            args += [after[0], after[0], after[1]]
        sql += " ORDER BY score, member LIMIT ?"
        args.append(limit)
        return [(m, s) for m, s in self._conn().execute(sql, args)]

    def index_count(
        self, index: str, *, min_score: float = float("-inf"), max_score: float = float("inf")
    ) -> int:
        lo = -1e308 if math.isinf(min_score) else min_score
        hi = 1e308 if math.isinf(max_score) else max_score
        row = (
            self._conn()
            .execute(
                "SELECT COUNT(*) FROM idx WHERE name = ? AND score >= ? AND score <= ?",
                (index, lo, hi),
            )
            .fetchone()
        )
        return int(row[0])

    def ping(self) -> dict[str, Any]:
        """Probe a write (a read-only file or a full disk is not ready) and the identity."""
        self._guard_identity()
        conn = self._conn()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self.identity is not None:
                self._verify_identity(_meta(conn, META_ID))
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('ready_probe', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (repr(self.clock()),),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        warnings = [] if mode == "wal" else [f"journal_mode is {mode}, not wal"]
        return {"backend": self.backend, "warnings": warnings}

    def _read_meta(self, name: str) -> str | None:
        return _meta(self._conn(), name)

    def _write_meta(self, name: str, value: str, *, only_if_absent: bool = False) -> str:
        conflict = "NOTHING" if only_if_absent else "UPDATE SET value = excluded.value"
        conn = self._conn()
        conn.execute(
            f"INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO {conflict}",
            (name, value),
        )
        stored = _meta(conn, name)
        assert stored is not None
        return stored

    def sweep(self, limit: int = SWEEP_BATCH) -> int:
        """Delete up to ``limit`` expired documents now; returns how many went.

        ``loopstop purge`` calls it until nothing is left.
        """
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            n = self._sweep(conn, self.clock(), limit)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return n

    def vacuum(self) -> None:
        """Rebuild the file, giving freed pages back to the disk (blocks writers)."""
        self._conn().execute("VACUUM")

    def row_count(self) -> int:
        """Documents stored, expired ones included (for tests and ``purge``)."""
        return int(self._conn().execute("SELECT COUNT(*) FROM kv").fetchone()[0])

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local = threading.local()

    # -- internals ---------------------------------------------------------

    @staticmethod
    def _select(conn: sqlite3.Connection, keys: list[str], now: float) -> dict[str, Doc | None]:
        out: dict[str, Doc | None] = dict.fromkeys(keys)
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT key, doc FROM kv WHERE key IN ({marks}) "
                "AND (expires_at IS NULL OR expires_at > ?)",
                [*chunk, now],
            )
            for key, doc in rows:
                out[key] = decode_doc(key, doc)
        return out

    @staticmethod
    def _apply(
        conn: sqlite3.Connection, plan: Plan[Any], read: dict[str, Doc | None], now: float
    ) -> None:
        plan.check()
        for key, write in plan.writes.items():
            if key not in read:
                raise RuntimeError(f"transaction wrote {key!r} without reading it")
            if write.doc is None:
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            else:
                _put(conn, key, write.doc, None if write.ttl_s is None else now + write.ttl_s)
        for key, inc in plan.increments.items():
            row = conn.execute(
                "SELECT doc FROM kv WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
                (key, now),
            ).fetchone()
            doc = json.loads(row[0]) if row else {}
            if not isinstance(doc, dict):
                raise RuntimeError(f"increment target {key!r} is not a JSON object")
            doc[inc.field] = doc.get(inc.field, 0) + inc.delta
            _put(conn, key, doc, None if inc.ttl_s is None else now + inc.ttl_s)
        for name, below in plan.trims:
            conn.execute("DELETE FROM idx WHERE name = ? AND score < ?", (name, below))
        for entry in plan.index:
            if entry.score is None:
                conn.execute(
                    "DELETE FROM idx WHERE name = ? AND member = ?", (entry.index, entry.member)
                )
            else:
                conn.execute(
                    "INSERT INTO idx (name, member, score) VALUES (?, ?, ?) "
                    "ON CONFLICT (name, member) DO UPDATE SET score = excluded.score",
                    (entry.index, entry.member, entry.score),
                )

    @staticmethod
    def _sweep(conn: sqlite3.Connection, now: float, limit: int = SWEEP_BATCH) -> int:
        cur = conn.execute(
            "DELETE FROM kv WHERE key IN (SELECT key FROM kv WHERE expires_at IS NOT NULL "
            "AND expires_at <= ? LIMIT ?)",
            (now, limit),
        )
        return cur.rowcount


def _meta(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def _put(conn: sqlite3.Connection, key: str, doc: Doc, expires_at: float | None) -> None:
    """Insert or replace the document at ``key`` (``expires_at``: epoch seconds, None: never)."""
    conn.execute(
        "INSERT INTO kv (key, doc, expires_at) VALUES (?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET doc = excluded.doc, expires_at = excluded.expires_at",
        (key, encode_doc(doc), expires_at),
    )
