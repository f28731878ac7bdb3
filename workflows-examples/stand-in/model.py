"""A stand-in model: an OpenAI-compatible upstream for the model gate, offline.

Run it beside the sidecar, on the address ``workflows-examples/loopstop.yaml``
gives the model gate's upstream, to watch the gate stop a looping agent
without an OpenAI account:

    python3 workflows-examples/stand-in/model.py            # http://127.0.0.1:8791/v1
    python3 workflows-examples/stand-in/model.py --api gemini   # http://127.0.0.1:8791

It speaks both APIs n8n's OpenAI Chat Model uses: ``POST /v1/responses``
(the Responses API, the node's default) and ``POST /v1/chat/completions``,
each streamed (Server-Sent Events, chunked, as OpenAI sends them) when the
request says ``stream: true``, and ``GET /v1/models`` (the credential test).
With ``--api gemini`` it is Google's Gemini API instead, as n8n's Google
Gemini Chat Model uses it (its Host is the stand-in's address, no path):
``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``
(``data:`` frames only, as Google sends them; ``?alt=sse``), ``GET
/v1beta/models`` (the credential test); a call has no id and carries a
``thoughtSignature``, as Gemini 3 sends it.
Every turn reports 10 tokens (7 in, 3 out). It answers by ``--mode``:

- ``tool_call`` (the default): a looping model, always the same call (the
  first offered tool, every schema property ``"again"``), a new call id
  each time: the gate ends the task by its rules (``same_call``, a budget);
- ``final``: a plain text answer (``FINAL answer``);
- ``text_then_tool``: some text, then the same call as ``tool_call``;
- ``429`` / ``500``: an OpenAI-style error; ``502_html``: a 502 with an HTML page;
- ``garbage``: a 200 whose body is not JSON (streamed: an event that is not JSON);
- ``no_usage``: as ``final`` without any usage;
- ``cut``: a stream that breaks after its first text event (non-streamed:
  the connection closes mid-body);
- ``slow``: answers after 2 s.

The failing modes show what the gate answers n8n when the model fails.
In the test suite, ``hold`` (a :class:`threading.Event`), when set on the
instance, makes a stream pause after its first text event until the test
sets it: the test can see what the gate relayed before the upstream
finished. Only the standard library: nothing to install.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = (
    "tool_call",
    "final",
    "text_then_tool",
    "429",
    "500",
    "502_html",
    "garbage",
    "no_usage",
    "cut",
    "slow",
)

USAGE_CHAT = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
USAGE_RESPONSES = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
USAGE_GEMINI = {"promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10}
#: The ``thoughtSignature`` a Gemini 3 model puts on its calls (base64, as the API's).
SIGNATURE = "c3RhbmQtaW4tc2lnbmF0dXJl"
APIS = ("openai", "gemini")
TEXT_PARTS = ["FINAL ", "ans", "wer"]


class FakeLLM:
    """The stand-in's state: its ``mode``, its ``api`` (``openai`` or ``gemini``)
    and every request it was sent (a POST's body, path and query,
    Authorization header and all its headers, names in lower case; a GET's
    path and headers in ``lists``); ``base`` is its ``.../v1`` address once
    served, ``root`` its address without a path (Gemini's Host)."""

    def __init__(self) -> None:
        self.mode = "tool_call"
        self.api = "openai"
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.headers: list[dict[str, str]] = []
        #: the path and headers of every model list request (``GET``)
        self.lists: list[tuple[str, dict[str, str]]] = []
        self.base = ""
        self.root = ""
        self.hold: threading.Event | None = None
        #: set once a stream has sent its first text event (with ``hold``)
        self.first_sent = threading.Event()
        #: set when a stream has written out its every event
        self.stream_done = threading.Event()
        #: ``time.perf_counter()`` just before the last stream's first text event was sent
        self.first_text_at: float | None = None
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def error(self) -> tuple[int, dict[str, Any]] | None:
        if self.mode in ("429", "500") and self.api == "gemini":
            status = "RESOURCE_EXHAUSTED" if self.mode == "429" else "INTERNAL"
            return int(self.mode), {
                "error": {"code": int(self.mode), "message": f"fake {self.mode}", "status": status}
            }
        if self.mode in ("429", "500"):
            return int(self.mode), {
                "error": {
                    "message": f"fake {self.mode}",
                    "type": "rate_limit" if self.mode == "429" else "server_error",
                    "code": None,
                }
            }
        return None


def first_tool(req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The first offered tool (either API's tool shape) and the same arguments for it every time.

    Each property of the tool's JSON schema gets the string ``"again"``; a
    request without tools asks for ``echo`` with ``{"note": "again"}``.
    """
    tools = req.get("tools") or []
    if not tools:
        return "echo", {"note": "again"}
    tool = tools[0]
    if "functionDeclarations" in tool:  # Gemini
        tool = (tool["functionDeclarations"] or [{}])[0]
    function = tool.get("function") or tool
    props = (function.get("parameters") or {}).get("properties") or {}
    return function.get("name", "echo"), {k: "again" for k in props} or {"note": "again"}


# -- chat completions --------------------------------------------------------------------


def chat_answer(llm: FakeLLM, req: dict[str, Any]) -> dict[str, Any]:
    n = llm.next_id()
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "stop"
    if llm.mode in ("tool_call", "text_then_tool"):
        name, arguments = first_tool(req)
        message["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
        finish = "tool_calls"
    if llm.mode != "tool_call":
        message["content"] = "".join(TEXT_PARTS)
    out: dict[str, Any] = {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": req.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if llm.mode != "no_usage":
        out["usage"] = USAGE_CHAT
    return out


def chat_events(llm: FakeLLM, req: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    answer = chat_answer(llm, req)
    head = {k: answer[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    message = answer["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield None, chunk({"role": "assistant", "content": ""})
    if message["content"]:
        for part in TEXT_PARTS:
            yield "text", chunk({"content": part})
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        start = {"index": i, "id": call["id"], "type": "function"}
        yield (
            None,
            chunk({"tool_calls": [{**start, "function": {"name": fn["name"], "arguments": ""}}]}),
        )
        half = len(fn["arguments"]) // 2
        for piece in (fn["arguments"][:half], fn["arguments"][half:]):
            yield None, chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield None, chunk({}, answer["choices"][0]["finish_reason"])
    if (req.get("stream_options") or {}).get("include_usage") and "usage" in answer:
        yield None, {**head, "choices": [], "usage": answer["usage"]}
    yield None, "[DONE]"


# -- the Responses API ------------------------------------------------------------------------


def responses_answer(llm: FakeLLM, req: dict[str, Any]) -> dict[str, Any]:
    n = llm.next_id()
    output: list[dict[str, Any]] = []
    if llm.mode != "tool_call":
        text = "".join(TEXT_PARTS)
        output.append(
            {
                "id": f"msg_fake{n}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    if llm.mode in ("tool_call", "text_then_tool"):
        name, arguments = first_tool(req)
        output.append(
            {
                "id": f"fc_fake{n}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{n}",
                "name": name,
                "arguments": json.dumps(arguments),
            }
        )
    out: dict[str, Any] = {
        "id": f"resp_fake{n}",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": req.get("model", "fake-model"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": req.get("tools") or [],
        "usage": None if llm.mode == "no_usage" else USAGE_RESPONSES,
    }
    return out


def responses_events(llm: FakeLLM, req: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    """The events OpenAI streams for a Response (the subset n8n's client reads and more)."""
    answer = responses_answer(llm, req)
    seq = itertools.count()

    def ev(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    started = {**answer, "status": "in_progress", "output": [], "usage": None}
    yield None, ev("response.created", response=started)
    yield None, ev("response.in_progress", response=started)
    for index, item in enumerate(answer["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            at = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield (
                None,
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                ),
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield None, ev("response.content_part.added", **at, part=part)
            for piece in TEXT_PARTS:
                yield "text", ev("response.output_text.delta", **at, delta=piece)
            yield None, ev("response.output_text.done", **at, text=text)
            yield None, ev("response.content_part.done", **at, part={**part, "text": text})
        else:
            at = {"item_id": item["id"], "output_index": index}
            yield (
                None,
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                ),
            )
            args = item["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                yield None, ev("response.function_call_arguments.delta", **at, delta=piece)
            yield None, ev("response.function_call_arguments.done", **at, arguments=args)
        yield None, ev("response.output_item.done", output_index=index, item=item)
    yield None, ev("response.completed", response=answer)


# -- Gemini ------------------------------------------------------------------------------------


def gemini_answer(llm: FakeLLM, req: dict[str, Any], model: str) -> dict[str, Any]:
    """A ``GenerateContentResponse``: the call has no id, and a ``thoughtSignature``."""
    n = llm.next_id()
    parts: list[dict[str, Any]] = []
    if llm.mode != "tool_call":
        parts.append({"text": "".join(TEXT_PARTS)})
    if llm.mode in ("tool_call", "text_then_tool"):
        name, arguments = first_tool(req)
        parts.append(
            {"functionCall": {"name": name, "args": arguments}, "thoughtSignature": SIGNATURE}
        )
    out: dict[str, Any] = {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "modelVersion": model,
        "responseId": f"resp-fake-{n}",
    }
    if llm.mode != "no_usage":
        out["usageMetadata"] = USAGE_GEMINI
    return out


def gemini_events(
    llm: FakeLLM, req: dict[str, Any], model: str
) -> Iterator[tuple[str | None, Any]]:
    """Each text piece a chunk, then the calls and ``finishReason`` with the usage
    (Gemini's usage is a running total: the last chunk's is the turn's)."""
    answer = gemini_answer(llm, req, model)
    head = {k: answer[k] for k in ("modelVersion", "responseId")}
    parts = answer["candidates"][0]["content"]["parts"]
    calls = [p for p in parts if "functionCall" in p]

    def chunk(chunk_parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {
            "content": {"role": "model", "parts": chunk_parts},
            "index": 0,
        }
        out: dict[str, Any] = {"candidates": [candidate], **head}
        if last:
            candidate["finishReason"] = "STOP"
            if "usageMetadata" in answer:
                out["usageMetadata"] = answer["usageMetadata"]
        return out

    if any("text" in p for p in parts):
        for i, piece in enumerate(TEXT_PARTS):
            yield "text", chunk([{"text": piece}], not calls and i == len(TEXT_PARTS) - 1)
    if calls:
        yield None, chunk(calls, True)


def gemini_models() -> dict[str, Any]:
    return {
        "models": [
            {
                "name": "models/fake-model",
                "displayName": "Fake model",
                "supportedGenerationMethods": ["generateContent", "countTokens"],
            }
        ]
    }


# -- HTTP ----------------------------------------------------------------------------------------


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler with one way to answer JSON."""

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (the gate's timeout) is expected here: no traceback."""


def _handler(llm: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # each event leaves at once (no 40 ms delayed-ACK stalls)

        def do_GET(self) -> None:
            llm.lists.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            if llm.api == "gemini" and self.path.partition("?")[0].endswith("/models"):
                return self._json(200, gemini_models())
            if self.path.partition("?")[0].endswith("/models"):
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

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, events: Iterator[tuple[str | None, Any]], named: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            texts = 0
            for tag, data in events:
                if llm.mode == "garbage" and tag == "text":
                    self._chunk(b"data: {not json\n\n")
                    break
                text = data if isinstance(data, str) else json.dumps(data)
                head = f"event: {data['type']}\n" if named and isinstance(data, dict) else ""
                if tag == "text" and texts == 0:
                    llm.first_text_at = time.perf_counter()
                self._chunk((head + f"data: {text}\n\n").encode())
                if tag == "text":
                    texts += 1
                    if texts == 1:
                        if llm.mode == "cut":
                            self.close_connection = True
                            return  # no terminating chunk: the stream breaks here
                        if llm.hold is not None:
                            llm.first_sent.set()
                            llm.hold.wait(10)
            # Every event is out: a client that stops reading at its final event (the
            # gate does at response.completed) may close before the terminator below.
            llm.stream_done.set()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _record(self, req: dict[str, Any]) -> None:
            llm.requests.append(req)
            llm.paths.append(self.path)
            llm.auth.append(self.headers.get("Authorization"))
            llm.headers.append({k.lower(): v for k, v in self.headers.items()})

        def _gemini(self, req: dict[str, Any]) -> None:
            path = self.path.split("?")[0]
            target = path.rsplit("/models/", 1)[-1]
            model, _, method = target.rpartition(":")
            if method == "streamGenerateContent":
                return self._stream(gemini_events(llm, req, model), named=False)
            if method != "generateContent":
                return self._json(
                    404, {"error": {"code": 404, "message": "no route", "status": "NOT_FOUND"}}
                )
            return self._answer(gemini_answer(llm, req, model))

        def _answer(self, answer: dict[str, Any]) -> None:
            if llm.mode == "garbage":
                body = b"this is not json"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
            if llm.mode == "cut":
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return None
            return self._json(200, answer)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            req = json.loads(raw or b"{}")
            self._record(req)
            failed = llm.error()
            if failed is not None:
                return self._json(*failed)
            if llm.mode == "502_html":
                page = b"<html><body>Bad gateway</body></html>"
                self.send_response(502)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return None
            if llm.mode == "slow":
                time.sleep(2)
            if llm.api == "gemini":
                return self._gemini(req)
            path = self.path.partition("?")[0]
            responses = path.endswith("/responses")
            if not responses and not path.endswith("/chat/completions"):
                return self._json(404, {"error": {"message": f"no route {self.path}"}})
            if req.get("stream"):
                events = responses_events(llm, req) if responses else chat_events(llm, req)
                return self._stream(events, named=responses)
            return self._answer(responses_answer(llm, req) if responses else chat_answer(llm, req))

    return Handler


@contextmanager
def serve(host: str = "127.0.0.1", port: int = 0, api: str = "openai") -> Iterator[FakeLLM]:
    """Serve a :class:`FakeLLM` of ``api`` in a background thread for the duration
    of the block."""
    llm = FakeLLM()
    llm.api = api
    server = _Server((host, port), _handler(llm))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    llm.root = f"http://{host}:{server.server_address[1]}"
    llm.base = llm.root + "/v1"
    try:
        yield llm
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--mode", choices=MODES, default="tool_call")
    parser.add_argument("--api", choices=APIS, default="openai")
    args = parser.parse_args()
    llm = FakeLLM()
    llm.mode = args.mode
    llm.api = args.api
    server = _Server((args.host, args.port), _handler(llm))
    where = f"http://{args.host}:{args.port}" + ("/v1" if args.api == "openai" else "")
    print(f"stand-in model ({args.api}, {args.mode}) on {where}", flush=True)
    with suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
