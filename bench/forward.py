"""The least a served forwarder adds to a model turn (bench/gate_vs_litellm.py):
a bare WSGI callable, under ``loopstop serve``'s gunicorn worker class and
settings, that reads the body, sends it to ``FORWARD_UPSTREAM`` with urllib3
(as the gate sends it) and relays the answer. No framework, no store, no
check: what the served hop itself costs on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import urllib3

JSON = {"Content-Type": "application/json"}


def create_app() -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    """The forwarder to ``FORWARD_UPSTREAM`` (a base URL the request's path
    less ``/v1/openai`` is appended to)."""
    upstream = os.environ["FORWARD_UPSTREAM"]
    pool = urllib3.PoolManager(maxsize=16, retries=False)

    def forward(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        path = environ["PATH_INFO"].removeprefix("/v1/openai")
        r = pool.request("POST", upstream + path, body=body, headers=JSON, timeout=10)
        data = r.data
        start_response(
            f"{r.status} {r.reason}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return forward
