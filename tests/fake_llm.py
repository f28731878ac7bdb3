"""A fake OpenAI-compatible upstream for the model gate tests (loopback only).

It records every request and answers by ``mode``: ``tool_call`` (always the
same call of the first offered tool), ``final`` (a plain answer), ``429`` / ``500`` (an
OpenAI-style error), ``slow`` (answers after 2 s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_http import JsonHandler, running


class FakeLLM:
    def __init__(self) -> None:
        self.mode = "tool_call"
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.base = ""

    def answer(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.mode in ("429", "500"):
            return int(self.mode), {
                "error": {
                    "message": f"fake {self.mode}",
                    "type": "rate_limit" if self.mode == "429" else "server_error",
                    "code": None,
                }
            }
        if self.mode == "slow":
            time.sleep(2)
        if self.mode == "tool_call":
            name, arguments = _first_tool(req)
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "FINAL answer"}
            finish = "stop"
        return 200, {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": req.get("model", "fake-model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }


def _first_tool(req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The first offered tool and the same arguments for it every time.

    Each property of the tool's JSON schema gets the string ``"again"``; a
    request without tools asks for ``echo`` with ``{"note": "again"}``.
    """
    tools = req.get("tools") or []
    if not tools:
        return "echo", {"note": "again"}
    function = tools[0].get("function", {})
    props = (function.get("parameters") or {}).get("properties") or {}
    return function.get("name", "echo"), {k: "again" for k in props} or {"note": "again"}


def _handler(llm: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.endswith("/models"):
                return self._json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {"id": "fake-model", "object": "model", "created": 0, "owned_by": "t"}
                        ],
                    },
                )
            return self._json(404, {"error": {"message": "no"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            req = json.loads(raw or b"{}")
            llm.requests.append(req)
            llm.auth.append(self.headers.get("Authorization"))
            status, body = llm.answer(req)
            self._json(status, body)

    return Handler


@contextmanager
def serve() -> Iterator[FakeLLM]:
    llm = FakeLLM()
    with running(_handler(llm)) as base:
        llm.base = base + "/v1"
        yield llm
