"""The PostgreSQL store: its transactions (read, decide, then lock, compare
and write in one pipeline), reads, listings, readiness, schema, meta entries
and sweeps (the package's docstring tells how)."""

from __future__ import annotations

import contextlib
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

from sidecar.errors import StoreUnavailable
from sidecar.store.base import (
    META_ID,
    META_SCHEMA,
    SCHEMA_VERSION,
    Doc,
    Migration,
    Plan,
    ServerClock,
    Snapshot,
    Store,
    StoreEvents,
    StoreOptions,
    T,
    TxnFn,
    decode_doc,
)
from sidecar.store.postgres import pipeline, sql
from sidecar.store.postgres.connection import (
    PARAMS,
    Deadlines,
    Pool,
    PooledConnection,
    check_url,
    open_pool,
)
from sidecar.store.recent import RecentValues
from sidecar.urls import redact_url

log = logging.getLogger("loopstop.store")


class _NotGuessed(Exception):
    """A transaction decided on a guess read a key it had not declared."""


class _Fenced(Exception):
    """The commit pipeline ran past its fence and wrote nothing (``LS408``)."""


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


class PostgresStore(Store):
    """The store on a PostgreSQL database, shared by every worker and instance.

    :param url: ``postgresql://user[:password]@host:port/db`` (``postgres://``
        too); libpq parameters pass through; ``isolation`` (``cas`` or
        ``serializable``), ``pool_size`` and ``sweep_interval_s`` are this
        store's.
    :param timeout_s: the deadline of one call (a decision), seconds.
    :param clock: wall clock for TTLs, epoch seconds.
    :param max_retries: attempts after a serialization failure or deadlock.
    :param events: where round trips and conflicts are reported.
    :raises ConfigError: never; connections open lazily, so every method
        raises :class:`StoreUnavailable` while the server does not answer.
    """

    backend = "postgresql"
    driver_errors = (psycopg.Error, psycopg_pool.PoolTimeout)
    schemes = ("postgresql", "postgres")

    @classmethod
    def check_url(cls, url: str) -> None:
        check_url(url)

    @classmethod
    def from_url(cls, url: str, options: StoreOptions) -> PostgresStore:
        return cls(url, timeout_s=options.timeout_s, events=options.events)

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        max_retries: int = 10,
        events: StoreEvents | None = None,
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
        self.events = events or StoreEvents()
        #: What this process last read or wrote per key (``recent_likely`` guesses).
        self.recent = RecentValues()
        self._pool: Pool | None = None
        self._deadlines = Deadlines()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._swept_at = time.monotonic()
        #: The server's clock against this one: fences are given in server time.
        self.server_clock = ServerClock()

    # -- connections -------------------------------------------------------

    def _get_pool(self) -> Pool:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = open_pool(
                    self.conninfo,
                    timeout_s=self.timeout_s,
                    size=self.pool_size,
                    deadlines=self._deadlines,
                )
                self._pid = os.getpid()
            return self._pool

    @contextmanager
    def _connection(self, deadline: float) -> Iterator[PooledConnection]:
        """A pooled connection bound to ``deadline`` (returned broken or clean):
        every wait on the server ends by then (:class:`.connection.Deadlines`).

        A database found without loopstop's tables (a fresh one put in the place
        of the one served from) is a store that lost its identity: refused
        until ``loopstop accept-store``, as an emptied Redis is.
        """
        pool = self._get_pool()
        conn = pool.getconn(timeout=max(0.001, deadline - time.monotonic()))
        deadlines = self._deadlines
        try:
            deadlines.arm(conn, deadline)
            yield conn
        except pgerrors.UndefinedTable:
            if self.identity is not None:
                self._verify_identity(None)  # raises the refusal
            raise
        except psycopg.OperationalError as exc:
            if deadlines.disarm(conn):  # the deadline ended the connection: say so
                self.server_clock.stale()  # a stall: compare the clocks again next time
                raise psycopg.OperationalError("no answer from the server by the deadline") from exc
            raise
        finally:
            deadlines.disarm(conn)
            idle = psycopg.pq.TransactionStatus.IDLE
            if not conn.closed and conn.info.transaction_status != idle:
                try:
                    deadlines.arm(conn, time.monotonic() + 1.0)
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    conn.close()
                finally:
                    deadlines.disarm(conn)
            conn.used_at = time.monotonic()
            pool.putconn(conn)

    def _where(self) -> str:
        return self.url_redacted

    def _compare_clocks(self, conn: PooledConnection) -> None:
        """Compare the server's clock with this host's when it is due
        (:class:`~sidecar.store.base.ServerClock`; one statement, not a
        decision's round trip)."""
        if not self.server_clock.due():
            return
        sent = time.time()
        row = conn.execute(sql.CLOCK).fetchone()
        if row is not None:
            self.server_clock.read(float(row[0]), sent, time.time())

    def fence(self, deadline: float) -> float | None:
        """The latest server time (epoch seconds) at which a pipeline sent now
        may still write: a margin before ``deadline`` (``time.monotonic``),
        when this process stops waiting for it (None: never compared)."""
        return self.server_clock.fence(max(0.0, deadline - time.monotonic()))

    def transact(
        self,
        keys: Iterable[str],
        fn: TxnFn[T],
        *,
        absent_likely: bool = False,
        recent_likely: bool = False,
    ) -> T:
        self._guard_identity()
        deadline = time.monotonic() + self.timeout_s
        declared = list(dict.fromkeys(keys))
        known = None
        if absent_likely and recent_likely and not self.serializable:
            known = self.recent.guess(declared)
        elif absent_likely and not self.serializable:
            known = dict.fromkeys(declared)
        elif recent_likely and not self.serializable:
            known = self.recent.recall(declared)
        with self._connection(deadline) as conn:
            self._compare_clocks(conn)
            guessed, seed = None, None
            if known is not None:
                recall = self.recent.get
                guessed, seed, raw, texts = pipeline.guess(
                    self, conn, declared, fn, known, recall, deadline
                )
                if guessed is not None:
                    self.recent.after(raw, guessed, None, texts)
            plan = guessed or self._decide(conn, declared, fn, deadline, seed)
        self._maybe_sweep()
        return plan.committed()

    def _decide(
        self,
        conn: PooledConnection,
        declared: list[str],
        fn: TxnFn[T],
        deadline: float,
        seed: list[Any] | None = None,
    ) -> Plan[T]:
        """Read, decide and write (:meth:`_attempt`) until one attempt commits
        (the first on ``seed``'s read when given: :func:`.pipeline.guess`'s).

        :raises StoreUnavailable: past the deadline under contention, or after
            ``max_retries`` conflicts.
        """
        # After a conflict, every key the losing attempt compared is
        # locked (in one sorted pass: exclusive for the ones it wrote,
        # shared for the rest) before it is read: a hot key then queues
        # instead of spinning, and the locks are taken in one order.
        hot: dict[str, bool] = {}
        for attempt in range(self.max_retries):
            try:
                first = seed if attempt == 0 else None
                return self._attempt(conn, declared, fn, hot, deadline, first)
            except _Conflict as conflict:
                for key in conflict.compared:
                    hot[key] = hot.get(key, False) or key in conflict.written
                pipeline.rollback(conn)
                self.events.conflict()
            except _Fenced:
                # Nothing written: the server ran the pipeline past its fence
                # (it stalled, or the clocks moved). Compare them again, then
                # read afresh and decide once more while time is left.
                pipeline.rollback(conn)
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        "postgres store: no decision within the deadline"
                    ) from None
                self.server_clock.stale()
                self._compare_clocks(conn)
            except _RETRYABLE:
                pipeline.rollback(conn)
                self.events.conflict()
                pause = random.uniform(0, min(0.05, 0.001 * 2**attempt))
                if time.monotonic() + pause >= deadline:
                    raise StoreUnavailable(
                        "postgres store: no decision within the deadline (contention)"
                    ) from None
                time.sleep(pause)
            except BaseException:
                pipeline.rollback(conn)
                raise
        raise StoreUnavailable(
            f"postgres store: gave up after {self.max_retries} conflicting transactions"
        )

    def _attempt(
        self,
        conn: PooledConnection,
        declared: list[str],
        fn: TxnFn[T],
        hot: dict[str, bool],
        deadline: float,
        seed: list[Any] | None = None,
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
        if seed is not None:
            identity, selected = seed
        else:
            with conn.pipeline():
                if self.serializable:
                    conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                elif hot:
                    conn.execute("BEGIN")
                    exclusive_ids = {sql.lock_id(k) for k, x in hot.items() if x}
                    shared_ids = {sql.lock_id(k) for k in hot} - exclusive_ids
                    conn.execute(
                        sql.LOCKS,
                        {"c": sql.LOCK_CLASS, "x": sorted(exclusive_ids), "s": sorted(shared_ids)},
                    )
                    held = exclusive_ids | shared_ids
                    held_exclusive = exclusive_ids
                identity = conn.execute(sql.IDENTITY, (META_ID,))
                selected = conn.execute(sql.SELECT, (declared, now))
            self.events.round_trip()
        reads += 1
        if self.identity is not None:
            row = identity.fetchone()
            self._verify_identity(None if row is None else row[0])
        self._keep(docs, raw, declared, selected)
        self.recent.remember(raw.items())

        def load(more: list[str]) -> None:
            nonlocal reads
            fresh = [k for k in dict.fromkeys(more) if k not in docs]
            if fresh:
                cur = conn.execute(sql.SELECT, (fresh, now))
                self.events.round_trip()
                reads += 1
                self._keep(docs, raw, fresh, cur)
                self.recent.remember((k, raw[k]) for k in fresh)

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
        exclusive = sorted({sql.lock_id(k) for k in plan.writes} - held_exclusive)
        shared = sorted({sql.lock_id(k) for k in compared} - set(exclusive) - held)
        begin = not self.serializable and not hot
        texts = pipeline.texts_of(plan)
        failure = pipeline.write(
            self,
            conn,
            plan,
            now,
            raw,
            compared,
            exclusive,
            shared,
            begin,
            texts,
            fence=self.fence(deadline),
        )
        if failure is None:
            self.recent.after(raw, plan, None, texts)
            return plan
        self.recent.forget(compared)
        if failure.sqlstate == "LS408":
            raise _Fenced() from failure
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

    def get_many(self, keys: Sequence[str]) -> dict[str, Doc | None]:
        self._guard_identity()
        unique = list(dict.fromkeys(keys))
        deadline = time.monotonic() + self.timeout_s
        with self._connection(deadline) as conn:
            with conn.pipeline():
                identity = conn.execute(sql.IDENTITY, (META_ID,))
                cur = conn.execute(sql.SELECT, (unique, self.clock()))
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
                identity = conn.execute(sql.IDENTITY, (META_ID,))
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
            self._deadlines.disarm(c)  # DDL may wait for another instance's migration
            with c.transaction():
                c.execute("SELECT pg_advisory_xact_lock(%s)", (sql.SCHEMA_LOCK,))
                c.execute(sql.META_DDL)
                row = c.execute(sql.IDENTITY, (META_SCHEMA,)).fetchone()
                if row is None or int(row[0]) <= current:
                    c.execute(sql.DDL)

    def _read_meta(self, name: str) -> str | None:
        """A meta entry; None when absent, also when the table is (an emptied database)."""
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            try:
                row = conn.execute(sql.IDENTITY, (name,)).fetchone()
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
            row = conn.execute(sql.IDENTITY, (name,)).fetchone()
        assert row is not None
        return str(row[0])

    def sweep(self, limit: int = SWEEP_BATCH) -> int:
        """Delete up to ``limit`` expired documents now; returns how many went.

        ``loopstop purge`` calls it until nothing is left.
        """
        with self._connection(time.monotonic() + self.timeout_s) as conn:
            return conn.execute(sql.SWEEP, (self.clock(), limit)).rowcount

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
        self._deadlines.close()
