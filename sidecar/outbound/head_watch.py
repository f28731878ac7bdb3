"""One deadline for an answer's head (its status line and headers), whatever
pace its bytes come at.

A socket read timeout bounds each read, not the head: a server that sends a
header line every half second, each within the read timeout, holds the
caller as long as it likes before any body is read (where
:mod:`sidecar.outbound.bounded_read` takes over). The gate's upstream pool
(:func:`bounded_pool`) makes its connections of a class that, while it reads
a head, has its socket watched by one thread per process (:class:`HeadWatch`):
a head still arriving at the exchange's deadline has its socket shut down,
which wakes the blocked read (it then fails: the caller maps it, by the
clock, to a timeout).

The deadline is the calling thread's (:func:`head_deadline`), set around
the request by the one caller that sends it, so urllib3's own API (its pool
and connection classes, ``ConnectionCls``) carries nothing new.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class HeadWatch:
    """Shuts down the sockets whose head is still being read at their deadline
    (:func:`time.monotonic` seconds), from one daemon thread started on first use."""

    def __init__(self) -> None:
        self._reset()
        # A process forked from this one starts with no watched socket and no
        # thread (it never inherits the parent's, nor a lock held at the fork).
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._armed: dict[int, socket.socket] = {}
        self._due: list[tuple[float, int]] = []  # (deadline, key), a heap
        self._keys = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, at: float) -> int:
        """Watch ``sock`` until :meth:`release`; shut it down at ``at``. Its key."""
        with self._cond:
            due, armed = self._due, self._armed
            while due and due[0][1] not in armed:
                heapq.heappop(due)  # released: the heap holds what is in flight, about
            if len(due) > 2 * len(armed) + 64:  # released ones behind a long wait
                due[:] = [(t, k) for t, k in due if k in armed]
                heapq.heapify(due)
            key = next(self._keys)
            armed[key] = sock
            heapq.heappush(due, (at, key))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="loopstop-upstream-head", daemon=True
                )
                self._thread.start()
            elif due[0][1] == key:  # the earliest now: the thread sleeps past it
                self._cond.notify()
            return key

    def release(self, key: int) -> bool:
        """Stop watching the socket of ``key`` (its head came, or failed): False
        when it was shut down first (its deadline passed)."""
        with self._cond:
            return self._armed.pop(key, None) is not None

    def backlog(self) -> int:
        """The deadlines held: the sockets watched, and released ones not yet
        dropped (at most about twice the first, plus 64)."""
        with self._cond:
            return len(self._due)

    def _run(self) -> None:
        while True:
            late: list[socket.socket] = []
            with self._cond:
                while self._due and self._due[0][1] not in self._armed:
                    heapq.heappop(self._due)  # released: forget its deadline
                wait = self._due[0][0] - time.monotonic() if self._due else None
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    _, key = heapq.heappop(self._due)
                    sock = self._armed.pop(key, None)
                    if sock is not None:
                        late.append(sock)
            for sock in late:
                with contextlib.suppress(Exception):  # closed already, or no shutdown
                    sock.shutdown(socket.SHUT_RDWR)


WATCH = HeadWatch()
_local = threading.local()


@contextlib.contextmanager
def head_deadline(at: float) -> Iterator[None]:
    """Within the block, an answer head this thread reads through a
    :func:`bounded_pool` connection must have come by ``at``
    (:func:`time.monotonic` seconds)."""
    _local.at = at
    try:
        yield
    finally:
        _local.at = None


class _HeadBounded:
    """A connection whose answer head is read under :func:`head_deadline`."""

    sock: socket.socket | None

    def getresponse(self) -> Any:
        """The answer, its head read by the deadline.

        :raises TimeoutError: the deadline passed first (its socket is shut
            down: what was read of the head is no answer; urllib3 reports it
            as a read timeout).
        """
        at = getattr(_local, "at", None)
        sock = self.sock
        if at is None or sock is None:
            return super().getresponse()  # type: ignore[misc]
        key = WATCH.arm(sock, at)
        try:
            answer = super().getresponse()  # type: ignore[misc]
        finally:
            in_time = WATCH.release(key)
        if not in_time:  # a shut socket reads as the head's end: it is not
            answer.close()
            raise TimeoutError("the answer's head did not come by the deadline")
        return answer


class _Connection(_HeadBounded, HTTPConnection):
    pass


class _TLSConnection(_HeadBounded, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


def bounded_pool(**kwargs: Any) -> urllib3.PoolManager:
    """A :class:`urllib3.PoolManager` (``kwargs`` as its own) whose connections
    read an answer's head under :func:`head_deadline`."""
    pool = urllib3.PoolManager(**kwargs)
    pool.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
    return pool
