"""A scripted OpenAI Chat Completions upstream (non-streamed and streamed)
whose every answer a test decides per request, and an n8n AI Agent on the
chat API to drive the model gate with it (its history re-sent every turn)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from local_http import JsonHandler, running

from conftest import N8N_TOKEN, Api, AppFactory

WORKFLOW = "wf-leads"
CHAT = "/v1/openai/chat/completions"
RESPONSES = "/v1/openai/responses"
WRITE = {"kind": "write", "operation_id": "crm-lead:{email}", "lease_s": 120}
GATE = {"default_model": "fake-model", "timeout_s": 5}
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}

Script = Callable[[dict[str, Any]], dict[str, Any]]


def call(cid: str, name: str, args: Any) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


def calls_msg(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def text_msg(text: str = "FINAL answer") -> dict[str, Any]:
    return {"role": "assistant", "content": text}


class Upstream:
    """What the scripted upstream saw and will answer."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.script: Script = lambda req: text_msg()
        #: an HTTP status to answer instead (once per entry, popped)
        self.statuses: list[int] = []
        self.lock = threading.Lock()
        self.base = ""


@contextmanager
def scripted() -> Iterator[Upstream]:
    up = Upstream()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            req = json.loads(raw)
            with up.lock:
                up.requests.append(req)
                up.headers.append({k.lower(): v for k, v in self.headers.items()})
                status = up.statuses.pop(0) if up.statuses else 200
            if status != 200:
                return self._json(status, {"error": {"message": "boom", "type": "server_error"}})
            message = up.script(req)
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            if req.get("stream"):
                return self._stream(message, finish)
            out = {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "created": 0,
                "model": "fake-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": USAGE,
            }
            self._json(200, out)

        def _stream(self, message: dict[str, Any], finish: str) -> None:
            chunks: list[dict[str, Any]] = []
            base = {
                "id": "chatcmpl-x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake-model",
            }
            if message.get("content"):
                delta = {"role": "assistant", "content": message["content"]}
                chunks.append(
                    {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                )
            for n, c in enumerate(message.get("tool_calls") or []):
                delta = {"tool_calls": [{"index": n, **c}]}
                chunks.append(
                    {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                )
            chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            chunks.append({**base, "choices": [], "usage": USAGE})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in chunks:
                self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    with running(Handler) as base:
        up.base = base
        yield up


def make_api(make_app: AppFactory, base: str, tools: dict[str, Any], **config: Any) -> Api:
    gate = {**GATE, "upstream_url": base, **config.pop("gate", {})}
    return Api(make_app(model_gate=gate, tools=tools, **config).test_client())


def fn_tool(name: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"email": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


class Chat:
    """An n8n AI Agent on the chat API: its history, re-sent every turn."""

    def __init__(
        self,
        api: Api,
        key: str,
        text: str = "ana@example.com",
        workflow: str = WORKFLOW,
        tools: tuple[str, ...] = ("create_lead",),
        stream: bool = False,
        extra_system: str = "",
    ) -> None:
        self.api = api
        self.stream = stream
        self.system = f"loopstop-task-key: {key}\nloopstop-workflow: {workflow}\n{extra_system}"
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": text},
        ]
        self.tools = [fn_tool(t) for t in tools]

    def body(self) -> dict[str, Any]:
        return {
            "model": "fake-model",
            "messages": list(self.history),
            "tools": self.tools,
            "stream": self.stream,
        }

    def post(self, body: dict[str, Any] | None = None, token: str = N8N_TOKEN):
        r = self.api.client.post(
            CHAT, json=body or self.body(), headers={"Authorization": f"Bearer {token}"}
        )
        return r

    def ask(self, token: str = N8N_TOKEN) -> tuple[int, str, list[tuple[str, str, Any]], Any]:
        r = self.post(token=token)
        if r.status_code != 200:
            return r.status_code, r.get_data(as_text=True), [], None
        if self.stream:
            return read_chat_stream(r.get_data(as_text=True))
        out = r.get_json()
        msg = out["choices"][0]["message"]
        cs = [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg.get("tool_calls") or []
        ]
        return 200, str(msg.get("content") or ""), cs, out

    def ran(self, cid: str, name: str, args: Any, output: str) -> None:
        echoed = json.dumps({**args, "id": cid}) if isinstance(args, dict) else json.dumps(args)
        self.history += [
            {
                "role": "assistant",
                "content": [],
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": echoed}}
                ],
            },
            {"role": "tool", "tool_call_id": cid, "content": output},
        ]


def read_chat_stream(text: str) -> tuple[int, str, list[tuple[str, str, Any]], Any]:
    events = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                events.append(json.loads(line[6:]))
    out, parts = "", {}
    for chunk in events:
        if "error" in chunk and chunk["error"] is not None:
            return 200, "ERROR " + json.dumps(chunk["error"]), [], events
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            out += delta.get("content") or ""
            for c in delta.get("tool_calls") or []:
                part = parts.setdefault(c["index"], {"args": ""})
                if c.get("id"):
                    part["id"] = c["id"]
                fn = c.get("function") or {}
                if fn.get("name"):
                    part["name"] = fn["name"]
                part["args"] += fn.get("arguments") or ""
    cs = [(p["id"], p["name"], json.loads(p["args"])) for _, p in sorted(parts.items())]
    return 200, out, cs, events


def task_of(api: Api, key: str, workflow: str = WORKFLOW) -> dict[str, Any]:
    status, out = api.post("/v1/tasks", {"task_key": key, "workflow": workflow})
    assert status == 200, out
    status, out = api.get(f"/v1/tasks/{out['task']['task_id']}")
    assert status == 200, out
    return dict(out)


def op_of(api: Api, oid: str, workflow: str = WORKFLOW) -> tuple[int, Any]:
    status, out = api.get(f"/v1/operations/{oid}", workflow=workflow)
    return status, out


def tool_msgs(req: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in req["messages"] if m.get("role") == "tool"]


def n_tool(req: dict[str, Any]) -> int:
    return len(tool_msgs(req))
