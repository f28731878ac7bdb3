"""How the PostgreSQL store reaches its database: the URL, a small pool per
process, and one deadline per call on every wait for the server.

The deadline is kept with public means only. On a server that answers, the
session's ``statement_timeout`` and ``lock_timeout`` end a slow statement or
a lock wait (set per connection from the call's timeout, as
``idle_in_transaction_session_timeout``); connecting waits libpq's
``connect_timeout`` and the pool's own timeout. A server that stopped
answering (stopped, partitioned away) answers nothing, not even a timeout:
:class:`Deadlines` then shuts the connection's socket down at the deadline
(``shutdown(2)`` on a duplicate of :meth:`psycopg.Connection.fileno`), so
libpq reads the end of the stream, psycopg raises
:class:`psycopg.OperationalError` and the pool discards the connection: a
503 at the deadline, not a hang.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg
import psycopg_pool

from sidecar.errors import ConfigError
from sidecar.store.base import check_parameters

#: URL query parameters this store reads (the rest goes to libpq).
PARAMS = frozenset({"isolation", "pool_size", "sweep_interval_s"})

#: A pooled connection unused this long (s) is checked with one round trip before
#: a decision uses it: the server or a proxy may have closed it meanwhile
#: (``idle_session_timeout``, a restart), and a decision on it would be a 503.
IDLE_CHECK_S = 30.0


def check_url(url: str) -> None:
    """Validate a ``postgresql://`` (or ``postgres://``) URL: libpq's own
    parameters (``sslmode``, ...) pass through; this store's are checked.

    :raises ConfigError: a bad ``isolation``, ``pool_size`` or ``sweep_interval_s``.
    """
    query = parse_qs(urlparse(url).query)
    isolation = query.get("isolation", ["cas"])[-1]
    if isolation not in ("cas", "serializable"):
        raise ConfigError([("store", "isolation must be cas or serializable")])
    if "pool_size" in query and not query["pool_size"][-1].isdigit():
        raise ConfigError([("store", "pool_size must be a positive integer")])
    check_parameters(url, None, PARAMS - {"isolation"})


class PooledConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection of the store's pool."""

    #: When the connection last went back to the pool (None: never used yet).
    used_at: float | None = None


@dataclass
class _Armed:
    """A connection's deadline and a duplicate of its socket to shut down then."""

    deadline: float
    sock: socket.socket


def _shut(sock: socket.socket) -> None:
    """End the connection under ``sock`` for its user (both directions), then
    close the duplicate (libpq's own descriptor stays open until it closes it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the peer
    finally:
        sock.close()


class Deadlines:
    """Ends every wait of an armed connection at its deadline (see the module).

    One thread per store and process watches the armed connections, started
    at the first :meth:`arm` and ended after :data:`IDLE_S` with nothing
    armed; a forked child starts its own.
    """

    #: Seconds the watching thread waits with nothing armed before it ends.
    IDLE_S = 10.0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._armed: dict[int, _Armed] = {}
        self._fired: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: When the watching thread wakes by itself next: it is woken earlier only
        #: for an earlier deadline (a call arming a later one costs it nothing).
        self._wake_at = math.inf

    def arm(self, conn: psycopg.Connection[Any], deadline: float) -> None:
        """End every wait of ``conn`` at ``deadline`` (``time.monotonic``
        seconds), in place of an earlier deadline of it.

        :raises psycopg.OperationalError: the connection is already lost.
        """
        if self._pid != os.getpid():
            self._reset()  # a forked child: the parent's thread is not here
        armed = _Armed(deadline, socket.socket(fileno=os.dup(conn.fileno())))
        with self._cond:
            before = self._armed.pop(id(conn), None)
            self._fired.discard(id(conn))
            self._armed[id(conn)] = armed
            self._stopping = False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch,
                    args=(self._cond,),
                    name="loopstop-pg-deadlines",
                    daemon=True,
                )
                self._thread.start()
            elif deadline < self._wake_at:
                self._cond.notify()
        if before is not None:
            before.sock.close()

    def disarm(self, conn: psycopg.Connection[Any]) -> bool:
        """No deadline for ``conn`` any more (once this returns, none will fire).

        :returns: True when its deadline had passed: the connection was ended.
        """
        with self._cond:
            armed = self._armed.pop(id(conn), None)
            fired = id(conn) in self._fired
            self._fired.discard(id(conn))
        if armed is not None:
            armed.sock.close()
        return fired

    def close(self) -> None:
        """Disarm every connection and let the watching thread end."""
        with self._cond:
            armed, self._armed = list(self._armed.values()), {}
            self._fired.clear()
            self._stopping = True
            self._cond.notify()
        for each in armed:
            each.sock.close()

    def _watch(self, cond: threading.Condition) -> None:
        with cond:
            while True:
                now = time.monotonic()
                for key, armed in list(self._armed.items()):
                    if armed.deadline <= now:
                        del self._armed[key]
                        self._fired.add(key)
                        _shut(armed.sock)
                if self._armed:
                    self._wake_at = min(a.deadline for a in self._armed.values())
                    cond.wait(self._wake_at - now)
                    continue
                self._wake_at = math.inf
                if not self._stopping:
                    cond.wait(self.IDLE_S)
                if not self._armed and (self._stopping or time.monotonic() - now >= self.IDLE_S):
                    self._thread = None
                    return


def check_idle(conn: PooledConnection, *, deadlines: Deadlines) -> None:
    """The pool's check: a connection idle past :data:`IDLE_CHECK_S` must answer
    within a second, else the pool drops it and hands out another."""
    if conn.used_at is None or time.monotonic() - conn.used_at < IDLE_CHECK_S:
        return
    deadlines.arm(conn, time.monotonic() + 1.0)
    try:
        conn.execute("SELECT 1")
    finally:
        deadlines.disarm(conn)


class Pool(psycopg_pool.ConnectionPool[PooledConnection]):
    """psycopg's pool, collectable from any thread: a pool dropped while one of
    its own workers holds the last reference stops without joining that one.

    (psycopg_pool's ``_closed`` and ``_signal_stop_worker`` are its own names:
    ``tests/stores/test_conformance.py`` fails when they move.)
    """

    def __del__(self) -> None:
        if getattr(self, "_closed", True):
            return
        for worker in self._signal_stop_worker():
            if worker is not threading.current_thread():
                worker.join(1.0)


def open_pool(conninfo: str, *, timeout_s: float, size: int, deadlines: Deadlines) -> Pool:
    """A pool of up to ``size`` connections to ``conninfo``, opening in the
    background: every session's statements and lock waits end after
    ``timeout_s`` on the server, a transaction left idle after ten times that."""
    ms = max(1, int(timeout_s * 1000))
    pool = Pool(
        conninfo,
        connection_class=PooledConnection,
        min_size=1,
        max_size=max(1, size),
        kwargs={
            "autocommit": True,
            "connect_timeout": max(1, int(timeout_s + 0.999)),
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
        check=functools.partial(check_idle, deadlines=deadlines),
        timeout=timeout_s,
        num_workers=1,
        name="loopstop",
    )
    pool.open(wait=False)
    return pool
