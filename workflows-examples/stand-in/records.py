"""A stand-in system of record for the example workflows: a CRM and a notes service.

Run it beside the sidecar and n8n, on the address the examples use:

    python3 workflows-examples/stand-in/records.py            # http://127.0.0.1:8790

Routes (JSON in and out; data lives in memory until it stops):

- ``POST /crm/orders`` creates a CRM order (``idempotent-crm-write``); every
  create is kept, duplicates included, so a second write would show;
  ``GET /crm/orders?order_id=...`` answers ``{found, orders}`` (the flow's
  reconcile branch asks it);
- ``POST /notes`` creates a ticket note (the agent example's tool);
  ``GET /notes/<task_id>`` answers ``{count, notes}`` (the ``note_created``
  check of ``workflows-examples/loopstop.yaml`` asks it).

Only the standard library: nothing to install.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class Records:
    """The stand-in's data: CRM orders (duplicates kept) and ticket notes.

    :ivar slow_orders: order ids whose create answers only after 4 s (the
        write lands, the caller's timeout fires first: an unknown outcome).
    """

    def __init__(self) -> None:
        self.orders: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = []
        self.slow_orders: set[str] = set()
        self.lock = threading.Lock()


def handler(data: Records) -> type[BaseHTTPRequestHandler]:
    """A request handler class serving ``data``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, body: object) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> dict[str, Any]:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw or b"{}")
            return body if isinstance(body, dict) else {}

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            body = self._body()
            if path == "/crm/orders":
                with data.lock:
                    order = {"id": f"crm-{len(data.orders) + 1}", **body}
                    data.orders.append(order)
                if str(body.get("order_id")) in data.slow_orders:
                    time.sleep(4)  # committed, but the caller times out first
                return self._json(201, order)
            if path == "/notes":
                with data.lock:
                    note = {"id": f"note-{len(data.notes) + 1}", **body}
                    data.notes.append(note)
                return self._json(201, note)
            return self._json(404, {"error": "no such route"})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/crm/orders":
                wanted = parse_qs(parts.query).get("order_id", [""])[0]
                found = [o for o in data.orders if str(o.get("order_id")) == wanted]
                return self._json(200, {"found": bool(found), "orders": found})
            if parts.path.startswith("/notes/"):
                task_id = unquote(parts.path.removeprefix("/notes/"))
                notes = [n for n in data.notes if n.get("task_id") == task_id]
                return self._json(200, {"count": len(notes), "notes": notes})
            return self._json(404, {"error": "no such route"})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller that gave up before the answer (its timeout, a worker that died)
        is an ordinary event for a slow create: no traceback for it."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serving(data: Records, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``data`` in a background thread; yields the base URL."""
    server = _Server((host, port), handler(data))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    args = parser.parse_args()
    server = _Server((args.host, args.port), handler(Records()))
    print(f"stand-in system of record on http://{args.host}:{args.port}", flush=True)
    with suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
