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
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

log = logging.getLogger("loopstop")

#: The environ key the application calls once it has read the whole body.
BODY_READ = "loopstop.request_read"

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _has_body(environ: dict[str, Any]) -> bool:
    length = environ.get("CONTENT_LENGTH") or "0"
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    return chunked or length not in ("", "0")


class BoundedThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gthread with a deadline on reading each request (headers and body).

    The deadline (seconds) is ``LOOPSTOP_REQUEST_READ_TIMEOUT_S``, which
    ``loopstop serve --request-timeout`` sets; each worker reads it once.
    """

    read_timeout_s: float = 10.0

    def init_process(self) -> None:
        import os

        self.read_timeout_s = float(os.environ.get("LOOPSTOP_REQUEST_READ_TIMEOUT_S", "10"))
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
