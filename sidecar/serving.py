"""How ``loopstop serve`` keeps slow clients from taking the workers n8n needs.

gunicorn's ``gthread`` worker serves each process's connections from a
bounded pool of threads; an idle connection waits in the worker's poller,
not in a thread (gunicorn defers a connection that sends nothing for 5 s).
What gthread lacks is a bound on *reading* a request: a client that sends
one header line every few seconds keeps a thread for as long as it likes.
:class:`BoundedThreadWorker` adds that bound: from the request's first
byte, its headers and body must arrive within ``request_read_timeout_s``
(``--request-timeout``), or the connection is shut down, which frees the
thread at once. The application's own work (a check, the model upstream)
is not limited by it: the clock stops when the body has been read.

Writing is bounded too (a client that sends requests, pipelined or not, and
never reads the answers would otherwise keep a thread blocked in ``send``
for as long as it keeps the connection open). Each write of a response is
tried without blocking first; when the client's buffers are full, the
thread may wait for it only if one of ``slow_writers`` places of its worker
is free, and then for ``write_timeout_s`` at most (``http.write_timeout_s``,
``http.slow_writers``); otherwise, or past that, the connection is cut and
the thread is free again. So clients that do not read can hold at most
``slow_writers`` threads of a worker, each for at most ``write_timeout_s``,
and the other threads stay free for n8n's requests and probes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from gunicorn.workers.gthread import ThreadWorker

log = logging.getLogger("loopstop")

#: The environ key the application calls once it has read the whole body.
BODY_READ = "loopstop.request_read"

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: The environment ``loopstop serve`` hands each worker its bounds in.
READ_TIMEOUT_ENV = "LOOPSTOP_REQUEST_READ_TIMEOUT_S"
WRITE_TIMEOUT_ENV = "LOOPSTOP_WRITE_TIMEOUT_S"
SLOW_WRITERS_ENV = "LOOPSTOP_SLOW_WRITERS"


class _WriteBounded:
    """A client socket whose ``sendall`` is bounded (:class:`BoundedThreadWorker`);
    everything else is the socket's own."""

    def __init__(self, sock: socket.socket, worker: BoundedThreadWorker) -> None:
        self._sock = sock
        self._worker = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def sendall(self, data: bytes) -> None:
        """Send all of ``data``: at once if the client's buffers take it, else by
        waiting for the client in one of the worker's slow-writer places within
        ``write_timeout_s``.

        :raises BrokenPipeError: no place is free, or the client did not take
            the data in time: the connection is cut (gunicorn closes it quietly).
        """
        sock, view = self._sock, memoryview(data)
        sent = 0
        sock.setblocking(False)
        try:
            while sent < len(view):
                try:
                    sent += sock.send(view[sent:])
                except BlockingIOError:
                    break
        finally:
            sock.setblocking(True)
        if sent == len(view):
            return
        worker = self._worker
        if not worker.slow_writers.acquire(blocking=False):
            worker.cut(sock, "every slow-writer place of this worker is taken")
        try:
            sock.settimeout(worker.write_timeout_s)
            try:
                sock.sendall(view[sent:])  # one deadline for the whole rest (Python >= 3.5)
            except TimeoutError:
                worker.cut(sock, f"the client took nothing for {worker.write_timeout_s:.0f} s")
            finally:
                sock.settimeout(None)
        finally:
            worker.slow_writers.release()


def _has_body(environ: dict[str, Any]) -> bool:
    length = environ.get("CONTENT_LENGTH") or "0"
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    return chunked or length not in ("", "0")


class BoundedThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gthread with a deadline on reading each request (headers and body) and a
    bound on writing its answer to a client that does not read.

    The bounds come from the environment ``loopstop serve`` sets, read once
    per worker: :data:`READ_TIMEOUT_ENV` (``--request-timeout``, seconds),
    :data:`WRITE_TIMEOUT_ENV` (``http.write_timeout_s``, seconds) and
    :data:`SLOW_WRITERS_ENV` (``http.slow_writers``; 0: half the threads).
    """

    read_timeout_s: float = 10.0
    write_timeout_s: float = 10.0

    def init_process(self) -> None:
        self.read_timeout_s = float(os.environ.get(READ_TIMEOUT_ENV, "10"))
        self.write_timeout_s = float(os.environ.get(WRITE_TIMEOUT_ENV, "10"))
        places = int(os.environ.get(SLOW_WRITERS_ENV, "0")) or self.cfg.threads // 2
        self.slow_writers = threading.BoundedSemaphore(max(1, min(places, self.cfg.threads - 1)))
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._armed_lock = threading.Lock()
        self._current = threading.local()
        threading.Thread(target=self._watch, name="loopstop-read-deadline", daemon=True).start()
        super().init_process()  # runs the worker loop; never returns

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app: WsgiApp = self.wsgi  # type: ignore[has-type]

        def bounded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            conn = getattr(self._current, "conn", None)
            environ[BODY_READ] = lambda: self._release(conn)
            if not _has_body(environ):
                self._release(conn)  # the headers were all there was to read
            return app(environ, start_response)

        self.wsgi = bounded

    def handle_request(self, req: Any, conn: Any) -> Any:
        """gunicorn's, writing the answer through :class:`_WriteBounded`."""
        real = conn.sock
        conn.sock = _WriteBounded(real, self)
        try:
            return super().handle_request(req, conn)
        finally:
            conn.sock = real

    def cut(self, sock: socket.socket, why: str) -> NoReturn:
        """Shut a client's connection down (its thread is then free).

        :raises BrokenPipeError: always, for gunicorn to close the connection.
        """
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        log.info("closed a connection that does not read its answers: %s", why)
        raise BrokenPipeError(errno.EPIPE, why)

    def handle(self, conn: Any) -> Any:
        self._current.conn = conn
        self._arm(conn)
        try:
            return super().handle(conn)
        finally:
            self._release(conn)
            self._current.conn = None

    def _arm(self, conn: Any) -> None:
        with self._armed_lock:
            self._armed[id(conn)] = (time.monotonic() + self.read_timeout_s, conn.sock)

    def _release(self, conn: Any) -> None:
        if conn is not None:
            with self._armed_lock:
                self._armed.pop(id(conn), None)

    def _watch(self) -> None:
        """Shut down connections still sending their request past the deadline."""
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._armed_lock:
                late = [(k, s) for k, (at, s) in self._armed.items() if at <= now]
                for key, _ in late:
                    del self._armed[key]
            for _, sock in late:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it
                log.info(
                    "closed a connection that sent no complete request within %.0f s",
                    self.read_timeout_s,
                )
