"""PostgreSQL store: durable multi-instance, on the database n8n already runs.

Layout (schema version 1; every name starts with ``loopstop_`` so the
tables can sit in n8n's own database)::

    loopstop_kv   (key TEXT PRIMARY KEY, doc TEXT JSON, expires_at FLOAT8 epoch s | NULL)
    loopstop_idx  (name TEXT, member TEXT, score FLOAT8, PRIMARY KEY (name, member))
                  + index (name, score, member) for listings and the queue
    loopstop_meta (key TEXT PRIMARY KEY, value TEXT)  -- schema_version, store_id, ...
    loopstop_increment(doc, field, delta)             -- an increment, in SQL

Documents are stored as JSON *text* (the exact bytes :func:`encode_doc`
wrote: integers past 64 bits and lone surrogates come back unchanged, which
``jsonb`` would refuse or reorder).

One transaction per decision, a compare-and-set like the Redis store's:
the documents are read by one statement (no lock held while the policy
decides), then one pipeline sends ``BEGIN``, transaction-scoped advisory
locks on every compared key (``pg_advisory_xact_lock``, keyed by a hash of
the key, in sorted order: a lock exists whether or not its row does, so two
first ``begin`` of one id cannot both insert), ``loopstop_check`` (every
compared document still as read, and the store identity unchanged; else it
raises and nothing is written), the writes and ``COMMIT``. A changed
document means the function runs again on fresh reads (a jittered back-off
from the second conflict on), within the deadline. Increments are
``INSERT ... ON CONFLICT DO UPDATE`` applied to the row's value at commit
and never compared. Locks are held only while that one pipeline runs on the
server, never across the client's decision: a slow or descheduled worker
thread never holds others up. ``?isolation=serializable`` (reads and writes
in one ``SERIALIZABLE`` transaction, serialization failures retried) is kept
for comparison; ``bench/pg_strategy.py`` measures the two side by side
(docs/deployment.md has its figures, and those of a third design, locks
held across the decision, measured before it was replaced, and why this one
is the default).

Round trips: two per decision (the read; the commit pipeline), one more
for a key first read inside the function; a decision that writes nothing
after one read needs no commit.

Every call has one deadline (``timeout_s``): a statement, a lock wait and
the wait for a connection from the pool all end with it (the connection's
socket waits too, so a server that stopped answering is a 503 at the
deadline, not a hang). A connection lost before ``COMMIT`` was answered
admits nothing: the server rolls back what it did not commit, and the
caller gets a 503 whose retry sees the true state. Expired rows are
invisible to reads at once and deleted by ``loopstop purge`` and by a
bounded sweep every ``sweep_interval_s``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import psycopg
import psycopg_pool
from psycopg import errors as pgerrors

from sidecar import metrics
from sidecar.errors import StoreUnavailable
from sidecar.store.base import (
    META_ID,
    META_SCHEMA,
    SCHEMA_VERSION,
    Doc,
    Migration,
    Plan,
    Snapshot,
    Store,
    T,
    TxnFn,
    decode_doc,
    encode_doc,
)
from sidecar.urls import redact_url

log = logging.getLogger("loopstop.store")

_DDL = """
CREATE TABLE IF NOT EXISTS loopstop_kv (
    key TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    expires_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS loopstop_kv_expiry ON loopstop_kv (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS loopstop_idx (
    name TEXT NOT NULL,
    member TEXT NOT NULL,
    score DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name, member)
);
CREATE INDEX IF NOT EXISTS loopstop_idx_order ON loopstop_idx (name, score, member);
CREATE OR REPLACE FUNCTION loopstop_increment(doc TEXT, field TEXT, delta BIGINT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE d JSONB := doc::jsonb;
BEGIN
    IF jsonb_typeof(d) <> 'object' THEN
        RAISE EXCEPTION 'increment target is not a JSON object' USING ERRCODE = '22023';
    END IF;
    RETURN jsonb_set(d, ARRAY[field], to_jsonb(COALESCE((d ->> field)::numeric, 0) + delta))::text;
END
$fn$;
CREATE OR REPLACE FUNCTION loopstop_check(
    keys TEXT[], expected TEXT[], now DOUBLE PRECISION, store_id TEXT
) RETURNS VOID LANGUAGE plpgsql AS $fn$
DECLARE changed INT;
BEGIN
    IF store_id IS NOT NULL AND store_id IS DISTINCT FROM
            (SELECT value FROM loopstop_meta WHERE key = 'store_id') THEN
        RAISE EXCEPTION 'the store identity changed' USING ERRCODE = 'LS409';
    END IF;
    SELECT count(*) INTO changed FROM unnest(keys, expected) AS e(key, doc)
        LEFT JOIN loopstop_kv kv
            ON kv.key = e.key AND (kv.expires_at IS NULL OR kv.expires_at > now)
        WHERE kv.doc IS DISTINCT FROM e.doc;
    IF changed > 0 THEN
        RAISE EXCEPTION '% document(s) changed since read', changed USING ERRCODE = 'LS409';
    END IF;
END
$fn$;
"""
_META_DDL = "CREATE TABLE IF NOT EXISTS loopstop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

#: The advisory lock class of every key lock (two-integer form: other
#: applications' single-bigint advisory locks never meet ours).
LOCK_CLASS = 0x4C53
#: The lock taken while the schema is created or migrated.
SCHEMA_LOCK = 0x4C530001

_SELECT = (
    "SELECT key, doc FROM loopstop_kv WHERE key = ANY(%s) "
    "AND (expires_at IS NULL OR expires_at > %s)"
)
_LOCK = "SELECT count(pg_advisory_xact_lock(%s, k)) FROM unnest(%s::int4[]) AS k"
_IDENTITY = "SELECT value FROM loopstop_meta WHERE key = %s"
_LOCKS = (
    "SELECT count(CASE WHEN l.x THEN pg_advisory_xact_lock(%(c)s, l.k) "
    "ELSE pg_advisory_xact_lock_shared(%(c)s, l.k) END) FROM ("
    "SELECT k, true AS x FROM unnest(%(x)s::int4[]) AS k UNION ALL "
    "SELECT k, false FROM unnest(%(s)s::int4[]) AS k ORDER BY k) AS l"
)
_CHECK = "SELECT loopstop_check(%s::text[], %s::text[], %s, %s)"
_PUT = (
    "INSERT INTO loopstop_kv (key, doc, expires_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET doc = EXCLUDED.doc, expires_at = EXCLUDED.expires_at"
)
_DELETE = "DELETE FROM loopstop_kv WHERE key = %s"
_INCREMENT = (
    "INSERT INTO loopstop_kv AS kv (key, doc, expires_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET doc = CASE "
    "WHEN kv.expires_at IS NOT NULL AND kv.expires_at <= %s THEN EXCLUDED.doc "
    "ELSE loopstop_increment(kv.doc, %s, %s) END, expires_at = EXCLUDED.expires_at"
)
_TRIM = "DELETE FROM loopstop_idx WHERE name = %s AND score < %s"
_UNINDEX = "DELETE FROM loopstop_idx WHERE name = %s AND member = %s"
_INDEX = (
    "INSERT INTO loopstop_idx (name, member, score) VALUES (%s, %s, %s) "
    "ON CONFLICT (name, member) DO UPDATE SET score = EXCLUDED.score"
)
_SWEEP = (
    "DELETE FROM loopstop_kv WHERE key IN (SELECT key FROM loopstop_kv "
    "WHERE expires_at IS NOT NULL AND expires_at <= %s LIMIT %s)"
)


class _Conflict(Exception):
    """A document changed between its read and the commit (nothing was written).

    :ivar written: the keys the plan that lost would have written.
    :ivar compared: the keys it compared.
    """

    def __init__(self, written: set[str], compared: set[str]) -> None:
        super().__init__("a compared document changed since it was read")
        self.written = written
        self.compared = compared


#: SQLSTATEs after which nothing was committed and the decision may run again:
#: serialization failure, deadlock, and a racing insert (SERIALIZABLE only).
_RETRYABLE = (pgerrors.SerializationFailure, pgerrors.DeadlockDetected, pgerrors.UniqueViolation)

#: Expired rows deleted per sweep.
SWEEP_BATCH = 1000

#: A pooled connection unused this long (s) is checked with one round trip before
#: a decision uses it: the server or a proxy may have closed it meanwhile
#: (``idle_session_timeout``, a restart), and a decision on it would be a 503.
IDLE_CHECK_S = 30.0

#: URL query parameters this store reads (the rest goes to libpq).
PARAMS = {"isolation", "pool_size", "sweep_interval_s"}


def _lock_id(key: str) -> int:
    """A signed 32-bit hash of ``key`` (a collision only serializes two keys)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big", signed=True)


class _DeadlineConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection whose every wait on the server ends at ``deadline``.

    A wait past it closes the connection (its state is unknown) and raises
    :class:`psycopg.OperationalError`.
    """

    deadline: float | None = None
    #: When the connection last went back to the pool (None: never used yet).
    used_at: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if self.deadline is not None:
            left = max(0.001, self.deadline - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        try:
            return super().wait(gen, interval, timeout)
        except pgerrors._WaitTimeout:
            self.pgconn.finish()
            raise psycopg.OperationalError("no answer from the server by the deadline") from None


def _check_idle(conn: _DeadlineConnection) -> None:
    """The pool's check: a connection idle past :data:`IDLE_CHECK_S` must answer
    within a second, else the pool drops it and hands out another."""
    if conn.used_at is None or time.monotonic() - conn.used_at < IDLE_CHECK_S:
        return
    conn.deadline = time.monotonic() + 1.0
    try:
        conn.execute("SELECT 1")
    finally:
        conn.deadline = None


class _Pool(psycopg_pool.ConnectionPool[_DeadlineConnection]):
    """psycopg's pool, collectable from any thread: a pool dropped while one of
    its own workers holds the last reference stops without joining that one."""

    def __del__(self) -> None:
        if getattr(self, "_closed", True):
            return
        for worker in self._signal_stop_worker():
            if worker is not threading.current_thread():
                worker.join(1.0)


class PostgresStore(Store):
    """The store on a PostgreSQL database, shared by every worker and instance.

    :param url: ``postgresql://user[:password]@host:port/db`` (``postgres://``
        too); libpq parameters pass through; ``isolation`` (``cas`` or
        ``serializable``), ``pool_size`` and ``sweep_interval_s`` are this
        store's.
    :param timeout_s: the deadline of one call (a decision), seconds.
    :param clock: wall clock for TTLs, epoch seconds.
    :param max_retries: attempts after a serialization failure or deadlock.
    :raises ConfigError: never; connections open lazily, so every method
        raises :class:`StoreUnavailable` while the server does not answer.
    """

    backend = "postgresql"
    driver_errors = (psycopg.Error, psycopg_pool.PoolTimeout)

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        max_retries: int = 10,
    ) -> None:
        parsed = urlparse(url)
        query = parse_qs(parsed.query)
        own = {k: query.pop(k)[-1] for k in list(query) if k in PARAMS}
        self.serializable = own.get("isolation", "cas") == "serializable"
        self.pool_size = int(own.get("pool_size", "4"))
        self.sweep_interval_s = float(own.get("sweep_interval_s", "60"))
        scheme = "postgresql"
        self.conninfo = urlunparse(
            parsed._replace(scheme=scheme, query=urlencode({k: v[-1] for k, v in query.items()}))
        )
        self.url_redacted = redact_url(self.conninfo)
        self.timeout_s = timeout_s
        self.clock = clock
        self.max_retries = max_retries
        self._pool: _Pool | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._swept_at = time.monotonic()

    # -- connections -------------------------------------------------------

    def _get_pool(self) -> _Pool:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                ms = max(1, int(self.timeout_s * 1000))
                self._pool = _Pool(
                    self.conninfo,
                    connection_class=_DeadlineConnection,
                    min_size=1,
                    max_size=max(1, self.pool_size),
                    kwargs={
                        "autocommit": True,
                        "connect_timeout": max(1, int(self.timeout_s + 0.999)),
                        "options": (
                            f"-c statement_timeout={ms} -c lock_timeout={ms} "
                            f"-c idle_in_transaction_session_timeout={10 * ms}"
                        ),
                        "application_name": "loopstop",
                        # No server-side prepared statements: a pipeline that a
                        # conflict aborts would leave psycopg's cache of them wrong.
                        "prepare_threshold": None,
                    },
                    open=False,
                    check=_check_idle,
                    timeout=self.timeout_s,
                    num_workers=1,
                    name="loopstop",
                )
                self._pool.open(wait=False)
                self._pid = os.getpid()
            return self._pool

    @contextmanager
    def _connection(self, deadline: float) -> Iterator[_DeadlineConnection]:
        """A pooled connection bound to ``deadline`` (returned broken or clean).

        A database found without loopstop's tables (a fresh one put in the place
        of the one served from) is a store that lost its identity: refused
        until ``loopstop accept-store``, as an emptied Redis is.
        """
        pool = self._get_pool()
        conn = pool.getconn(timeout=max(0.001, deadline - time.monotonic()))
        conn.deadline = deadline
        try:
            yield conn
        except pgerrors.UndefinedTable:
            if self.identity is not None:
                self._verify_identity(None)  # raises the refusal
            raise
        finally:
            conn.deadline = None
            idle = psycopg.pq.TransactionStatus.IDLE
            if not conn.closed and conn.info.transaction_status != idle:
                try:
                    conn.deadline = time.monotonic() + 1.0
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    conn.close()
                conn.deadline = None
            conn.used_at = time.monotonic()
            pool.putconn(conn)

    def _where(self) -> str:
        return self.url_redacted

    # -- interface ---------------------------------------------------------

    def transact(
        self,
        keys: Iterable[str],
        fn: TxnFn[T],
        *,
        absent_likely: bool = False,
        recent_likely: bool = False,
    ) -> T:
        del absent_likely  # a read is one statement: nothing to save by guessing
        self._guard_identity()
        deadline = time.monotonic() + self.timeout_s
        declared = list(dict.fromkeys(keys))
        with self._connection(deadline) as conn:
            # After a conflict, every key the losing attempt compared is
            # locked (in one sorted pass: exclusive for the ones it wrote,
            # shared for the rest) before it is read: a hot key then queues
            # instead of spinning, and the locks are taken in one order.
            hot: dict[str, bool] = {}
            for attempt in range(self.max_retries):
                try:
                    plan = self._attempt(conn, declared, fn, hot)
                    break
                except _Conflict as conflict:
                    for key in conflict.compared:
                        hot[key] = hot.get(key, False) or key in conflict.written
                    self._rollback(conn)
                    metrics.STORE_CONFLICTS.inc()
                except _RETRYABLE:
                    self._rollback(conn)
                    metrics.STORE_CONFLICTS.inc()
                    pause = random.uniform(0, min(0.05, 0.001 * 2**attempt))
                    if time.monotonic() + pause >= deadline:
                        raise StoreUnavailable(
                            "postgres store: no decision within the deadline (contention)"
                        ) from None
                    time.sleep(pause)
                except BaseException:
                    self._rollback(conn)
                    raise
            else:
                raise StoreUnavailable(
                    f"postgres store: gave up after {self.max_retries} conflicting transactions"
                )
        self._maybe_sweep()
        return plan.committed()

    def _attempt(
        self, conn: _DeadlineConnection, declared: list[str], fn: TxnFn[T], hot: dict[str, bool]
    ) -> Plan[T]:
        """One try: read, decide, then lock, compare and write in one pipeline.

        :param hot: keys to lock before reading them (True: exclusively).
        :raises _Conflict: a compared document changed since it was read.
        """
        now = self.clock()
        docs: dict[str, Doc | None] = {}
        raw: dict[str, str | None] = {}
        reads = 0
        held: set[int] = set()
        held_exclusive: set[int] = set()
        with conn.pipeline():
            if self.serializable:
                conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            elif hot:
                conn.execute("BEGIN")
                exclusive_ids = {_lock_id(k) for k, x in hot.items() if x}
                shared_ids = {_lock_id(k) for k in hot} - exclusive_ids
                conn.execute(
                    _LOCKS,
                    {"c": LOCK_CLASS, "x": sorted(exclusive_ids), "s": sorted(shared_ids)},
                )
                held = exclusive_ids | shared_ids
                held_exclusive = exclusive_ids
            identity = conn.execute(_IDENTITY, (META_ID,))
            selected = conn.execute(_SELECT, (declared, now))
        metrics.STORE_ROUND_TRIPS.inc()
        reads += 1
        if self.identity is not None:
            row = identity.fetchone()
            self._verify_identity(None if row is None else row[0])
        self._keep(docs, raw, declared, selected)

        def load(more: list[str]) -> None:
            nonlocal reads
            fresh = [k for k in dict.fromkeys(more) if k not in docs]
            if fresh:
                cur = conn.execute(_SELECT, (fresh, now))
                metrics.STORE_ROUND_TRIPS.inc()
                reads += 1
                self._keep(docs, raw, fresh, cur)

        plan = fn(Snapshot(docs, load))
        plan.check()
        for key in plan.writes:
            if key not in docs:
                raise RuntimeError(f"transaction wrote {key!r} without reading it")
        quiet = not (plan.writes or plan.index or plan.trims or plan.increments)
        if quiet and reads == 1:
            if self.serializable or hot:
                conn.execute("COMMIT")
            return plan  # one statement read it all at one instant
        compared = [k for k in raw if k not in plan.unchecked]
        # Written keys exclusively, keys only read shared (readers of a
        # workflow's stop never wait for each other), in one sorted pass.
        # A key held shared and now written is locked exclusively too (else
        # two such writers could both pass the check and one overwrite the other).
        exclusive = sorted({_lock_id(k) for k in plan.writes} - held_exclusive)
        shared = sorted({_lock_id(k) for k in compared} - set(exclusive) - held)
        # The server's refusal may come back while the pipeline is still sending: it is
        # caught inside the block, so the pipeline ends quietly (psycopg logs a warning
        # for an error that leaves the block), and raised once the pipeline is closed.
        failure: psycopg.Error | None = None
        try:
            with conn.pipeline():
                try:
                    if not self.serializable:
                        if not hot:
                            conn.execute("BEGIN")
                        if exclusive or shared:
                            conn.execute(_LOCKS, {"c": LOCK_CLASS, "x": exclusive, "s": shared})
                        conn.execute(
                            _CHECK, (compared, [raw[k] for k in compared], now, self.identity)
                        )
                    self._apply(conn, plan, now)
                    conn.execute("COMMIT")
                except psycopg.Error as exc:
                    failure = exc
        except psycopg.Error as exc:  # at the pipeline's end: the refusal, or "aborted" after it
            failure = failure or exc
        finally:
            metrics.STORE_ROUND_TRIPS.inc()  # a pipeline that lost was a round trip too
        if failure is None:
            return plan
        if failure.sqlstate == "LS409":
            raise _Conflict(set(plan.writes), set(compared)) from failure
        if isinstance(failure, pgerrors.InvalidParameterValue):
            raise RuntimeError(f"increment: {failure.diag.message_primary}") from failure
        raise failure

    @staticmethod
    def _keep(
        docs: dict[str, Doc | None],
        raw: dict[str, str | None],
        keys: list[str],
        cur: psycopg.Cursor[tuple[Any, ...]],
    ) -> None:
        docs.update(dict.fromkeys(keys))
        raw.update(dict.fromkeys(keys))
        for key, doc in cur.fetchall():
            raw[key] = doc
            docs[key] = decode_doc(key, doc)

    @staticmethod
    def _apply(conn: _DeadlineConnection, plan: Plan[Any], now: float) -> None:
        cur = conn.cursor()
        puts = [
            (k, encode_doc(w.doc), None if w.ttl_s is None else now + w.ttl_s)
            for k, w in plan.writes.items()
            if w.doc is not None
        ]
        deletes = [(k,) for k, w in plan.writes.items() if w.doc is None]
        if puts:
            cur.executemany(_PUT, puts)
        if deletes:
            cur.executemany(_DELETE, deletes)
        if plan.increments:
            cur.executemany(
                _INCREMENT,
                [
                    (
                        key,
                        encode_doc({inc.field: inc.delta}),
                        None if inc.ttl_s is None else now + inc.ttl_s,
                        now,
                        inc.field,
                        inc.delta,
                    )
                    for key, inc in plan.increments.items()
                ],
            )
        if plan.trims:
            cur.executemany(_TRIM, plan.trims)
        removed = [(e.index, e.member) for e in plan.index if e.score is None]
        added = [(e.index, e.member, e.score) for e in plan.index if e.score is not None]
        if removed:
            cur.executemany(_UNINDEX, removed)
        if added:
            cur.executemany(_INDEX, added)

    @staticmethod
    def _rollback(conn: _DeadlineConnection) -> None:
        if conn.closed:
            return
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            conn.close()  # the pool discards it

    def get_many(self, keys: Sequence[str]) -> dict[str, Doc | None]:
        self._guard_identity()
        unique = list(dict.fromkeys(keys))
        deadline = time.monotonic() + self.timeout_s
        with self._connection(deadline) as conn:
            with conn.pipeline():
                identity = conn.execute(_IDENTITY, (META_ID,))
                cur = conn.execute(_SELECT, (unique, self.clock()))
            row = identity.fetchone()
            docs: dict[str, Doc | None] = {}
            self._keep(docs, {}, unique, cur)
        if self.identity is not None:
            self._verify_identity(None if row is None else row[0])
        return docs

    def index_page(
        self,
        index: str,
        *,
        min_score: float = float("-inf"),
        max_score: float = float("inf"),
        after: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[tuple[str, float]]:
        self._guard_identity()
        sql = (
            "SELECT member, score FROM loopstop_idx WHERE name = %s AND score >= %s AND score <= %s"
        )
        args: list[Any] = [index, min_score, max_score]
        if after is not None:
            sql += " AND (score, member) > (%s, %s)"
            args += [after[0], after[1]]
        sql += " ORDER BY score, member LIMIT %s"
        args.append(limit)
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            return [(str(m), float(s)) for m, s in conn.execute(sql, args).fetchall()]

    def index_count(
        self, index: str, *, min_score: float = float("-inf"), max_score: float = float("inf")
    ) -> int:
        self._guard_identity()
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            row = conn.execute(
                "SELECT count(*) FROM loopstop_idx WHERE name = %s AND score >= %s AND score <= %s",
                (index, min_score, max_score),
            ).fetchone()
        return int(row[0]) if row else 0

    def ping(self) -> dict[str, Any]:
        """Probe a write (a read-only standby is not ready), the identity and durability."""
        self._guard_identity()
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            with conn.pipeline():
                conn.execute(
                    "INSERT INTO loopstop_meta (key, value) VALUES ('ready_probe', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (repr(self.clock()),),
                )
                identity = conn.execute(_IDENTITY, (META_ID,))
                settings = conn.execute(
                    "SELECT name, setting FROM pg_settings "
                    "WHERE name IN ('fsync', 'synchronous_commit')"
                )
            row = identity.fetchone()
            found = dict(settings.fetchall())
        if self.identity is not None:
            self._verify_identity(None if row is None else row[0])
        warnings = [
            f"{name} is off: a crash can lose committed operations"
            for name in ("fsync", "synchronous_commit")
            if found.get(name) == "off"
        ]
        return {
            "backend": self.backend,
            "isolation": "serializable" if self.serializable else "cas",
            "warnings": warnings,
        }

    def ensure_schema(
        self,
        current: int = SCHEMA_VERSION,
        migrations: Mapping[int, Migration] | None = None,
        *,
        expected_identity: str | None = None,
    ) -> int:
        """Create the tables (once, under a lock) unless the stored schema is newer,
        then as :meth:`Store.ensure_schema`."""
        self._create_tables(current)
        return super().ensure_schema(current, migrations, expected_identity=expected_identity)

    def accept(self) -> tuple[str | None, str]:
        """As :meth:`Store.accept`, creating the tables first in a database that
        has none (a fresh one put in the place of the one served from)."""
        self._create_tables(SCHEMA_VERSION)
        return super().accept()

    def _create_tables(self, current: int) -> None:
        """The tables, functions and indexes, unless the stored schema is newer."""
        with self._connection(time.monotonic() + max(10.0, self.timeout_s)) as c:
            c.deadline = None  # DDL may wait for another instance's migration
            with c.transaction():
                c.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                c.execute(_META_DDL)
                row = c.execute(_IDENTITY, (META_SCHEMA,)).fetchone()
                if row is None or int(row[0]) <= current:
                    c.execute(_DDL)

    def _read_meta(self, name: str) -> str | None:
        """A meta entry; None when absent, also when the table is (an emptied database)."""
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            try:
                row = conn.execute(_IDENTITY, (name,)).fetchone()
            except pgerrors.UndefinedTable:
                return None
        return None if row is None else str(row[0])

    def _write_meta(self, name: str, value: str, *, only_if_absent: bool = False) -> str:
        conflict = "NOTHING" if only_if_absent else "UPDATE SET value = EXCLUDED.value"
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            conn.execute(
                f"INSERT INTO loopstop_meta (key, value) VALUES (%s, %s) "
                f"ON CONFLICT (key) DO {conflict}",
                (name, value),
            )
            row = conn.execute(_IDENTITY, (name,)).fetchone()
        assert row is not None
        return str(row[0])

    def sweep(self, limit: int = SWEEP_BATCH) -> int:
        """Delete up to ``limit`` expired documents now; returns how many went.

        ``loopstop purge`` calls it until nothing is left.
        """
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            return conn.execute(_SWEEP, (self.clock(), limit)).rowcount

    def _maybe_sweep(self) -> None:
        """The periodic sweep, after a decision, at most every ``sweep_interval_s``."""
        now = time.monotonic()
        if now - self._swept_at < self.sweep_interval_s:
            return
        self._swept_at = now
        with contextlib.suppress(StoreUnavailable):  # logged; the next interval tries again
            self.sweep()

    def row_count(self) -> int:
        """Documents stored, expired ones included (for tests and ``purge``)."""
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            row = conn.execute("SELECT count(*) FROM loopstop_kv").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.close(timeout=1.0)
            self._pool = None
