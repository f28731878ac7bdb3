"""A task driven over HTTP (create, model turns, tool calls, results), and the
terminal reasons the API tests reached (``REACHED``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flask import Flask

from conftest import Api

#: every envelope reason an Agent saw; tests/api/tasks checks that each is reached
REACHED: set[str] = set()


class Agent:
    """A task driven over HTTP: create, model turns, tool calls and results."""

    def __init__(self, api: Api, token: str = "default", **create: Any) -> None:
        self.api = api
        self.token = token
        status, body = api.post("/v1/tasks", {"workflow": "wf-sheets", **create}, token=token)
        assert status in (200, 201), body
        self.id = body["task"]["task_id"]
        self.base = f"/v1/tasks/{self.id}"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, out = self.api.post(self.base + path, body, token=self.token)
        assert status == 200, out
        if out.get("envelope"):
            REACHED.add(out["envelope"]["reason"])
        return dict(out)

    def model(self, **body: Any) -> dict[str, Any]:
        return self.post("/model-calls", body)

    def call(self, tool: str, args: Any = None, kind: str = "read", **kw: Any) -> dict[str, Any]:
        return self.post("/tool-calls", {"tool": tool, "kind": kind, "args": args or {}, **kw})

    def result(self, call: dict[str, Any], status: str = "ok", **kw: Any) -> dict[str, Any]:
        return self.post(f"/tool-calls/{call['call_id']}/result", {"status": status, **kw})


def admit_at_once(apps: Sequence[Flask], base: str, n: int) -> list[str]:
    """``n`` read calls of the task at ``base`` sent at once (a barrier), through
    ``apps`` in turn; their decisions."""
    barrier = threading.Barrier(n)

    def admit(i: int) -> str:
        client = Api(apps[i % len(apps)].test_client())
        barrier.wait()
        status, out = client.post(
            f"{base}/tool-calls", {"tool": "search", "kind": "read", "args": {"q": i}}
        )
        assert status == 200, out
        return str(out["decision"])

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(admit, range(n)))
