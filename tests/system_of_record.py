"""A small system of record for the check tests: a real HTTP server on loopback.

Orders (plain and gzip-compressed), comments, charges, paginated lists, a
slow endpoint, a broken one, a redirect to another host, and an echo of the
raw request path.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote, urlsplit

from local_http import JsonHandler, running


class SystemOfRecord:
    """The data behind the server; tests change it while it runs."""

    def __init__(self) -> None:
        self.orders: dict[str, dict[str, Any]] = {
            "ORD-1": {"id": "ORD-1", "status": "confirmed", "version": 3},
            "ORD-2": {"id": "ORD-2", "status": "pending", "version": 1},
        }
        self.comments = {"c-1"}
        self.charges: dict[str, dict[str, Any]] = {}
        self.seen_auth: list[str | None] = []
        self.base = ""


def _handler(data: SystemOfRecord) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            data.seen_auth.append(self.headers.get("Authorization"))
            parts = urlsplit(self.path)
            segments = parts.path.split("/")
            head = segments[1] if len(segments) > 1 else ""
            tail = unquote(segments[2]) if len(segments) > 2 else ""
            if head == "orders":
                order = data.orders.get(tail)
                return self._json(200, order) if order else self._json(404, {"error": "none"})
            if head == "comments":
                if tail in data.comments:
                    return self._json(200, {"id": tail})
                return self._json(404, {"error": "no such comment"})
            if head == "charges":
                charge = data.charges.get(tail)
                return self._json(200, charge) if charge else self._json(404, {})
            if head == "gzip":  # an order, compressed as a web server would
                order = data.orders.get(tail)
                if order is None:
                    return self._json(404, {"error": "none"})
                raw = gzip.compress(json.dumps(order).encode())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return None
            if head == "slow":
                time.sleep(2)
                return self._json(200, {"ok": True})
            if head == "trickle":  # one byte every 0.2 s for 3 s: each read is quick
                self.send_response(200)
                self.send_header("Content-Length", "15")
                self.end_headers()
                for _ in range(15):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
                return None
            if head == "huge":
                raw = b'{"status": "confirmed", "pad": "' + b"x" * 2_000_000 + b'"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return None
            if head == "deep":
                raw = b"[" * 100_000 + b"]" * 100_000
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return None
            if head == "bigrev":
                return self._json(200, {"status": "confirmed", "version": 1e300})
            if head == "broken":
                raw = b"<html>oops"
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return None
            if head == "redirect":
                self.send_response(302)
                self.send_header("Location", "http://evil.example/steal")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            if head == "echo":
                return self._json(
                    200,
                    {"path": parts.path, "query": parts.query, "host": self.headers.get("Host")},
                )
            return self._json(404, {"error": "no route"})

    return Handler


@contextmanager
def serve() -> Iterator[SystemOfRecord]:
    """Run the server on a free loopback port for the duration of the block."""
    data = SystemOfRecord()
    with running(_handler(data)) as base:
        data.base = base
        yield data


def scoped_checks(base: str) -> dict[str, Any]:
    """Checks against the system of record at ``base``, open to every workflow,
    to one, or to none (the hardening tests' scopes), and combined ones."""
    return {
        "charge_found": {
            "kind": "http",
            "url": base + "/charges/{ref}",
            "assert": ["status == 'succeeded'"],
            "workflows": ["*"],
        },
        "order_of_orders": {
            "kind": "http",
            "url": base + "/orders/{order_id}",
            "workflows": ["wf-orders"],
        },
        "order_unlisted": {"kind": "http", "url": base + "/orders/{order_id}"},
        "order_open": {"kind": "http", "url": base + "/orders/{order_id}", "workflows": ["*"]},
        "slow": {"kind": "http", "url": base + "/slow/{x}", "timeout_s": 5, "workflows": ["*"]},
        "answer_shape": {"kind": "json_schema", "schema": {"type": "object"}, "workflows": ["*"]},
        "receipts": {"kind": "operations", "operations": "ids", "workflows": ["*"]},
        "all_asks": {"kind": "all", "of": ["answer_shape", "charge_found"], "workflows": ["*"]},
        "any_mixed": {"kind": "any", "of": ["charge_found", "answer_shape"], "workflows": ["*"]},
    }
