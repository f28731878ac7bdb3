"""A real local HTTP server that answers like n8n 2.41.1's public API for executions.

Only what loopstop calls: ``GET /api/v1/executions?workflowId&status&limit&cursor``
(paginated with an opaque ``nextCursor``), ``GET /api/v1/executions/{id}`` and
``POST /api/v1/executions/{id}/stop`` (200 with the execution's status, 404
unknown, 409 not stoppable), behind ``X-N8N-API-KEY`` (401 otherwise), as
``ExecutionsPublicController`` does. Each execution's reaction to a stop is
set per test: ``cancel`` (n8n cancels it, reported after ``polls`` reads),
``ignore`` (it keeps running: nothing can confirm it), ``finish`` (it ended
by itself just before the stop arrived: 409, status ``success``).
A sub-execution names the execution that started it (``parent``), as n8n does:
read with ``includeData=true`` it carries ``data.parentExecution``
(``{executionId, workflowId, shouldResume}``, n8n-workflow
``RelatedExecution``) and n8n's mode ``integrated``; ``too_large`` answers
as n8n does past ``EXECUTIONS_DATA_MAX_DISPLAY_SIZE`` (empty data,
``dataTooLargeToDisplay: true``); ``data_pad`` pads the data with that many
bytes (an answer too large to read). Without ``includeData`` there is no
``data``.
``trickle_s`` makes every answer's body arrive one byte at a time, that many
seconds apart (the headers come at once): a slow n8n that each socket read
timeout alone cannot bound.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

STOPPABLE = ("new", "unknown", "waiting", "running")


@dataclass
class FakeExecution:
    id: str
    workflow_id: str
    mode: str = "webhook"
    status: str = "waiting"
    on_stop: str = "cancel"  # cancel | ignore | finish
    polls: int = 0  # reads after the stop before "canceled" shows
    stop_asked: bool = False
    parent: FakeExecution | None = None  # the execution that started it (a sub-execution)
    too_large: bool = False
    data_pad: int = 0

    def doc(self, include_data: bool = False) -> dict[str, Any]:
        doc = {
            "id": self.id,
            "workflowId": self.workflow_id,
            "mode": self.mode,
            "status": self.status,
            "finished": self.status == "success",
            "retryOf": None,
            "startedAt": "2026-12-01T10:00:00.000Z",
            "stoppedAt": None,
            "waitTill": None,
        }
        if include_data:
            doc.update(self.data())
        return doc

    def data(self) -> dict[str, Any]:
        """``data`` as n8n 2.41.1 answers it with ``includeData=true``."""
        if self.too_large:  # n8n-workflow createEmptyRunExecutionData()
            empty = {"version": 1, "startData": {}, "resultData": {"runData": {}}}
            return {"data": empty, "dataTooLargeToDisplay": True}
        data: dict[str, Any] = {
            "version": 1,
            "startData": {},
            "resultData": {"runData": {}, "lastNodeExecuted": "Start"},
            "executionData": {"nodeExecutionStack": [], "waitingExecution": {}},
        }
        if self.parent is not None:
            data["parentExecution"] = {
                "executionId": self.parent.id,
                "workflowId": self.parent.workflow_id,
                "shouldResume": True,
                "executionContext": {"version": 1, "establishedAt": 0, "source": "webhook"},
            }
        if self.data_pad:
            data["resultData"]["pad"] = "x" * self.data_pad
        return {"data": data, "dataTooLargeToDisplay": False}


@dataclass
class FakeN8n:
    """The server's state; ``calls`` records every request as ``(method, path)``."""

    key: str = "n8n-api-key-0123456789"
    page_size: int = 2
    delay_s: float = 0.0  # every answer comes this late
    trickle_s: float = 0.0  # every body comes one byte per this many seconds
    executions: dict[str, FakeExecution] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    data_reads: list[str] = field(default_factory=list)  # ids read with includeData=true
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, *items: FakeExecution) -> None:
        for item in items:
            self.executions[item.id] = item

    def stops(self) -> list[str]:
        """Execution ids a stop was asked for, in order."""
        return [p.split("/")[-2] for m, p in self.calls if m == "POST" and p.endswith("/stop")]


def _handler(state: FakeN8n) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not state.trickle_s:
                self.wfile.write(data)
                return
            with contextlib.suppress(OSError):  # the client gave up: fine
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(state.trickle_s)

        def _auth(self) -> bool:
            if state.delay_s:
                time.sleep(state.delay_s)
            if self.headers.get("X-N8N-API-KEY") != state.key:
                self._send(401, {"message": "unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            with state.lock:
                state.calls.append(("GET", url.path))
            if not self._auth():
                return
            parts = url.path.strip("/").split("/")
            if parts[:3] != ["api", "v1", "executions"]:
                self._send(404, {"message": "not found"})
                return
            with state.lock:
                if len(parts) == 3:
                    q = {k: v[0] for k, v in parse_qs(url.query).items()}
                    rows = [
                        e
                        for e in sorted(state.executions.values(), key=lambda e: int(e.id))
                        if ("workflowId" not in q or e.workflow_id == q["workflowId"])
                        and ("status" not in q or e.status == q["status"])
                    ]
                    start = int(q.get("cursor", "0"))
                    limit = min(int(q.get("limit", "100")), state.page_size)
                    page = rows[start : start + limit]
                    more = start + limit < len(rows)
                    self._send(
                        200,
                        {
                            "data": [e.doc() for e in page],
                            "nextCursor": str(start + limit) if more else None,
                        },
                    )
                    return
                ex = state.executions.get(parts[3])
                if ex is None:
                    self._send(404, {"message": "Not Found"})
                    return
                with_data = parse_qs(url.query).get("includeData") == ["true"]
                if with_data:
                    state.data_reads.append(ex.id)
                if ex.stop_asked and ex.on_stop == "cancel" and ex.status in STOPPABLE:
                    if ex.polls <= 0:
                        ex.status = "canceled"
                    ex.polls -= 1
                self._send(200, ex.doc(with_data))

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            with state.lock:
                state.calls.append(("POST", url.path))
            if not self._auth():
                return
            parts = url.path.strip("/").split("/")
            if parts[:3] != ["api", "v1", "executions"] or len(parts) != 5 or parts[4] != "stop":
                self._send(404, {"message": "not found"})
                return
            with state.lock:
                ex = state.executions.get(parts[3])
                if ex is None:
                    self._send(404, {"message": f"Could not find execution {parts[3]}"})
                    return
                if ex.on_stop == "finish" and not ex.stop_asked:
                    ex.status = "success"
                ex.stop_asked = True
                if ex.status not in STOPPABLE:
                    self._send(409, {"message": f"{ex.id} is currently {ex.status}"})
                    return
                if ex.on_stop == "cancel" and ex.polls <= 0:
                    ex.status = "canceled"
                self._send(200, {"mode": ex.mode, "status": ex.status, "finished": False})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller that gave up before the answer (the sidecar's deadline on
        n8n's API) is what some tests arrange: no traceback for it."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeN8nServer:
    """Serves :class:`FakeN8n` on a free loopback port until :meth:`stop`."""

    def __init__(self, state: FakeN8n | None = None) -> None:
        self.state = state or FakeN8n()
        self.server = _Server(("127.0.0.1", 0), _handler(self.state))
        self.port = self.server.server_address[1]
        self.api_url = f"http://127.0.0.1:{self.port}/api/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeN8nServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
