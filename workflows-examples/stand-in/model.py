"""A stand-in model: an OpenAI-compatible upstream for the model gate, offline.

Run it beside the sidecar, on the address ``workflows-examples/loopstop.yaml``
gives the model gate's upstream, to watch the gate stop a looping agent
without an OpenAI account:

    python3 workflows-examples/stand-in/model.py            # http://127.0.0.1:8791/v1

It speaks both APIs n8n's OpenAI Chat Model uses: ``POST /v1/responses``
(the Responses API, the node's default) and ``POST /v1/chat/completions``,
each streamed (Server-Sent Events, chunked, as OpenAI sends them) when the
request says ``stream: true``, and ``GET /v1/models`` (the credential test).
On the same port it speaks Anthropic's Messages API, as the Anthropic Chat
Model node uses it (its base URL is the address without ``/v1``):
``POST /v1/messages``, streamed with the ``event:`` names Anthropic's
clients need, and ``GET /v1/models`` when the request sends an
``anthropic-version`` header (Anthropic's clients always do).

The same two answer under Azure OpenAI's paths,
``POST /openai/deployments/<deployment>/chat/completions?api-version=...``
and ``.../responses`` (the query is ignored), and Ollama's chat API is
``POST /api/chat`` (NDJSON lines, streamed unless ``stream: false``) with
``GET /api/tags``. ``--api`` only says which address to give the gate
(every API is served at once):

    python3 workflows-examples/stand-in/model.py --api ollama   # http://127.0.0.1:8791
    python3 workflows-examples/stand-in/model.py --api azure    # http://127.0.0.1:8791
    python3 workflows-examples/stand-in/model.py --api gemini   # http://127.0.0.1:8791

Google's Gemini API is there too, as n8n's Google Gemini Chat Model uses it
(its Host is the stand-in's address, no path):
``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``
(``data:`` frames only, as Google sends them; ``?alt=sse``), ``GET
/v1beta/models`` (the credential test; any ``/models`` list when served
with ``api="gemini"``); a call has no id and carries a
``thoughtSignature``, as Gemini 3 sends it.

Every turn reports 10 tokens (7 in, 3 out). It answers by ``--mode``:

- ``tool_call`` (the default): a looping model, always the same call (the
  first offered tool, every schema property ``"again"``), a new call id
  each time: the gate ends the task by its rules (``same_call``, a budget);
- ``final``: a plain text answer (``FINAL answer``);
- ``text_then_tool``: some text, then the same call as ``tool_call``;
- ``429`` / ``500``: an error in the API's own shape; ``502_html``: a 502 with an HTML page;
- ``garbage``: a 200 whose body is not JSON (streamed: an event that is not JSON);
- ``no_usage``: as ``final`` without any usage;
- ``cut``: a stream that breaks after its first text event (non-streamed:
  the connection closes mid-body);
- ``slow``: answers after 2 s;
- ``write``: an agent that writes (DESIGN §5.1), in every API: while the conversation holds
  fewer than ``--writes`` tool outputs (default 1), it proposes the first
  offered tool with every schema property set to the last user message's
  text (a lead's email, say), a new call id each time; then the final
  answer. With ``--fail-once`` the first turn after its writes answers 500
  once per user message (the execution fails after writing; the next
  delivery of the same message gets the final answer).

Hostile modes, each one way an upstream can try to slip past the gate (in
every API; the id modes only where the API has call ids):

- ``repeat_call``: one proposal of 5 copies of one call (same id, same arguments);
- ``fresh_ids``: one call a turn, always the id ``call_0``, arguments naming the turn;
- ``split_id``: two calls under one id, with two argument sets;
- ``empty_id``: a call whose id is ``""``;
- ``unoffered``: a call of a tool the request did not offer (``drop_tables``);
- ``hidden_call``: as ``tool_call``, but a Responses stream leaves the call out of
  ``response.completed``'s output (it is streamed only as item events);
- ``null_error``: a final answer whose chat chunks carry ``"error": null``;
- ``huge_usage``: a final answer reporting ``usage_tokens`` output tokens (10^400);
- ``overspend``: a final answer reporting 50 output tokens, whatever the limit;
- ``big``: a final answer of ``big_bytes`` (60 MB), gzip-encoded when ``gzip`` is set.

The failing modes show what the gate answers n8n when the model fails.
In the test suite, ``hold`` (a :class:`threading.Event`), when set on the
instance, makes a stream pause after its first text event until the test
sets it: the test can see what the gate relayed before the upstream
finished. Only the standard library: nothing to install.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

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
    "repeat_call",
    "fresh_ids",
    "split_id",
    "empty_id",
    "unoffered",
    "hidden_call",
    "null_error",
    "huge_usage",
    "overspend",
    "big",
    "write",
)
#: The modes whose answer proposes tool calls (``write_call``: a ``write`` turn that writes).
CALLING = ("tool_call", "text_then_tool", *MODES[10:16], "write_call")

USAGE_CHAT = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
USAGE_RESPONSES = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
USAGE_OLLAMA = {"prompt_eval_count": 7, "eval_count": 3}
USAGE_GEMINI = {"promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10}
#: The ``thoughtSignature`` a Gemini 3 model puts on its calls (base64, as the API's).
SIGNATURE = "c3RhbmQtaW4tc2lnbmF0dXJl"
APIS = ("openai", "ollama", "azure", "gemini")
TEXT_PARTS = ["FINAL ", "ans", "wer"]


class FakeLLM:
    """The stand-in's state: its ``mode``, its ``api`` (``gemini``: a model list
    answered in Gemini's shape) and every request it was sent (a POST's body,
    path and query, Authorization header and all its headers, names in lower
    case; a GET's path and headers in ``lists``); ``base`` is its ``.../v1``
    address once served, ``root`` its address without a path."""

    def __init__(self) -> None:
        self.mode = "tool_call"
        self.api = "openai"
        #: ``write`` mode: tool outputs to collect before the final answer
        self.writes = 1
        #: ``write`` mode: answer 500 once per user message after the writes
        self.fail_once = False
        #: ``write`` mode: the user messages that already failed once
        self.failed: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        #: every request's body as it arrived (bytes)
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.headers: list[dict[str, str]] = []
        #: the path and headers of every model list request (``GET``)
        self.lists: list[tuple[str, dict[str, str]]] = []
        self.base = ""
        #: the address without ``/v1``: the Anthropic, Ollama, Azure and Gemini base URL
        self.root = ""
        self.hold: threading.Event | None = None
        #: set once a stream has sent its first text event (with ``hold``)
        self.first_sent = threading.Event()
        #: set when a stream has written out its every event
        self.stream_done = threading.Event()
        #: ``time.perf_counter()`` just before the last stream's first text event was sent
        self.first_text_at: float | None = None
        #: ``huge_usage``: the output tokens reported; ``big``: the answer's size
        self.usage_tokens = 10**400
        self.big_bytes = 60 << 20
        self.gzip = False
        self._ids = itertools.count(1)

    def for_request(self, req: dict[str, Any]) -> FakeLLM:
        """The stand-in as this request sees it: in ``write`` mode, its mode is
        ``write_call``, ``500`` or ``final`` by the conversation so far (the
        state, ids and logs shared)."""
        if self.mode != "write":
            return self
        view = copy.copy(self)
        if tool_outputs(req) < self.writes:
            view.mode = "write_call"
            return view
        text = last_user_text(req)
        view.mode = "final"
        if self.fail_once and text not in self.failed:
            self.failed.add(text)
            view.mode = "500"
        return view

    def calls(self, req: dict[str, Any], n: int) -> list[tuple[str, str, str]]:
        """The calls turn ``n`` proposes, ``(id, tool, arguments)``, by mode."""
        name, arguments = first_tool(req)
        if self.mode == "write_call":
            text = last_user_text(req)
            return [(f"call_{n}", name, json.dumps({k: text for k in arguments}))]
        args = json.dumps(arguments)
        if self.mode == "repeat_call":
            return [(f"call_{n}", name, args)] * 5
        if self.mode == "fresh_ids":
            return [("call_0", name, json.dumps({"note": f"turn {n}"}))]
        if self.mode == "split_id":
            return [("call_0", name, '{"note": "a"}'), ("call_0", name, '{"note": "b"}')]
        if self.mode == "empty_id":
            return [("", name, args)]
        if self.mode == "unoffered":
            return [(f"call_{n}", "drop_tables", "{}")]
        return [(f"call_{n}", name, args)]

    def usage(self) -> tuple[int, int] | None:
        """``(input, output)`` tokens to report (None: no usage)."""
        if self.mode == "no_usage":
            return None
        if self.mode == "huge_usage":
            return 7, self.usage_tokens
        return 7, 50 if self.mode == "overspend" else 3

    def text(self) -> str:
        return "x" * self.big_bytes if self.mode == "big" else "".join(TEXT_PARTS)

    def next_id(self) -> int:
        return next(self._ids)

    def error(
        self, anthropic: bool = False, ollama: bool = False, gemini: bool = False
    ) -> tuple[int, dict[str, Any]] | None:
        if self.mode in ("429", "500") and gemini:
            status = "RESOURCE_EXHAUSTED" if self.mode == "429" else "INTERNAL"
            return int(self.mode), {
                "error": {"code": int(self.mode), "message": f"fake {self.mode}", "status": status}
            }
        if self.mode in ("429", "500") and anthropic:
            kind = "rate_limit_error" if self.mode == "429" else "api_error"
            message = f"fake {self.mode}"
            return int(self.mode), {"type": "error", "error": {"type": kind, "message": message}}
        if self.mode in ("429", "500") and ollama:
            return int(self.mode), {"error": f"fake {self.mode}"}
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
    """The first offered tool (any API's tool shape) and the same arguments for it every time.

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
    schema = function.get("parameters") or function.get("input_schema") or {}
    props = schema.get("properties") or {}
    return function.get("name", "echo"), {k: "again" for k in props} or {"note": "again"}


def _results(item: Any) -> int:
    """How many tool results a message holds (Anthropic's ``tool_result``
    blocks, Gemini's ``functionResponse`` parts)."""
    if not isinstance(item, dict):
        return 0
    content = item.get("content") if "content" in item else item.get("parts")
    if not isinstance(content, list):
        return 0
    return sum(
        1
        for b in content
        if isinstance(b, dict) and (b.get("type") == "tool_result" or "functionResponse" in b)
    )


def _items(req: dict[str, Any]) -> Any:
    return req.get("messages") or req.get("input") or req.get("contents") or []


def tool_outputs(req: dict[str, Any]) -> int:
    """How many tool outputs the request carries (any API)."""
    items = _items(req)
    if not isinstance(items, list):
        return 0
    return sum(
        1 if i.get("role") == "tool" or i.get("type") == "function_call_output" else _results(i)
        for i in items
        if isinstance(i, dict)
    )


def last_user_text(req: dict[str, Any]) -> str:
    """The text of the request's last user message (any API; not a tool result)."""
    items = _items(req)
    if isinstance(items, str):
        return items
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user" and not _results(item):
            content = item.get("content", item.get("parts"))
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


# -- chat completions --------------------------------------------------------------------


def chat_answer(llm: FakeLLM, req: dict[str, Any]) -> dict[str, Any]:
    n = llm.next_id()
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "stop"
    if llm.mode in CALLING:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": name, "arguments": args}}
            for i, name, args in llm.calls(req, n)
        ]
        finish = "tool_calls"
    if llm.mode not in CALLING or llm.mode == "text_then_tool":
        message["content"] = llm.text()
    out: dict[str, Any] = {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": req.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    used = llm.usage()
    if used is not None:
        out["usage"] = (
            USAGE_CHAT
            if used == (7, 3)
            else {"prompt_tokens": used[0], "completion_tokens": used[1], "total_tokens": sum(used)}
        )
    return out


def chat_events(llm: FakeLLM, req: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    answer = chat_answer(llm, req)
    head = {k: answer[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    message = answer["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return {**out, "error": None} if llm.mode == "null_error" else out

    yield None, chunk({"role": "assistant", "content": ""})
    if message["content"]:
        for part in _parts(llm):
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


def _parts(llm: FakeLLM) -> list[str]:
    """The text events of a streamed answer: 1 MB each in ``big``."""
    if llm.mode != "big":
        return TEXT_PARTS
    step = 1 << 20
    return ["x" * min(step, llm.big_bytes - at) for at in range(0, llm.big_bytes, step)]


# -- the Responses API ------------------------------------------------------------------------


def responses_answer(llm: FakeLLM, req: dict[str, Any]) -> dict[str, Any]:
    n = llm.next_id()
    output: list[dict[str, Any]] = []
    if llm.mode not in CALLING or llm.mode == "text_then_tool":
        text = llm.text()
        output.append(
            {
                "id": f"msg_fake{n}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    if llm.mode in CALLING:
        output.extend(
            {
                "id": f"fc_fake{n}_{k}",
                "type": "function_call",
                "status": "completed",
                "call_id": i,
                "name": name,
                "arguments": args,
            }
            for k, (i, name, args) in enumerate(llm.calls(req, n))
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
        "usage": _responses_usage(llm.usage()),
    }
    return out


def _responses_usage(used: tuple[int, int] | None) -> dict[str, Any] | None:
    if used is None or used == (7, 3):
        return None if used is None else USAGE_RESPONSES
    return {"input_tokens": used[0], "output_tokens": used[1], "total_tokens": sum(used)}


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
            for piece in _parts(llm):
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
    if llm.mode == "hidden_call":  # streamed as items, left out of the final output
        answer = {**answer, "output": [i for i in answer["output"] if i["type"] != "function_call"]}
    yield None, ev("response.completed", response=answer)


# -- Anthropic's Messages API -------------------------------------------------------------------


def messages_answer(llm: FakeLLM, req: dict[str, Any]) -> dict[str, Any]:
    n = llm.next_id()
    content: list[dict[str, Any]] = []
    if llm.mode not in CALLING or llm.mode == "text_then_tool":
        content.append({"type": "text", "text": llm.text()})
    if llm.mode in CALLING:
        content.extend(
            {
                "type": "tool_use",
                "id": i.replace("call_", "toolu_fake", 1),
                "name": name,
                "input": json.loads(args),
            }
            for i, name, args in llm.calls(req, n)
        )
    out: dict[str, Any] = {
        "id": f"msg_fake{n}",
        "type": "message",
        "role": "assistant",
        "model": req.get("model", "fake-model"),
        "content": content,
        "stop_reason": "tool_use" if content[-1]["type"] == "tool_use" else "end_turn",
        "stop_sequence": None,
    }
    used = llm.usage()
    if used is not None:
        out["usage"] = {"input_tokens": used[0], "output_tokens": used[1]}
    return out


def messages_events(llm: FakeLLM, req: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    """The events Anthropic streams for a Message (input tokens in ``message_start``,
    the cumulative output tokens in ``message_delta``)."""
    answer = messages_answer(llm, req)
    usage = answer.pop("usage", None)
    started = {**answer, "content": [], "stop_reason": None}
    if usage is not None:
        started["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 1}
    yield None, {"type": "message_start", "message": started}
    yield None, {"type": "ping"}
    for index, block in enumerate(answer["content"]):
        at = {"index": index}
        if block["type"] == "text":
            yield (
                None,
                {
                    "type": "content_block_start",
                    **at,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            for piece in _parts(llm):
                delta = {"type": "text_delta", "text": piece}
                yield "text", {"type": "content_block_delta", **at, "delta": delta}
        else:
            start = {**block, "input": {}}
            yield None, {"type": "content_block_start", **at, "content_block": start}
            args = json.dumps(block["input"])
            for piece in ("", args[: len(args) // 2], args[len(args) // 2 :]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield None, {"type": "content_block_delta", **at, "delta": delta}
        yield None, {"type": "content_block_stop", **at}
    end: dict[str, Any] = {"stop_reason": answer["stop_reason"], "stop_sequence": None}
    last = {"output_tokens": usage["output_tokens"]} if usage is not None else {}
    yield None, {"type": "message_delta", "delta": end, "usage": last}
    yield None, {"type": "message_stop"}


MODEL_LIST_ANTHROPIC = {
    "data": [
        {
            "type": "model",
            "id": "fake-model",
            "display_name": "Fake Model",
            "created_at": "2025-01-01T00:00:00Z",
            "lifecycle": "active",
        }
    ],
    "has_more": False,
    "first_id": "fake-model",
    "last_id": "fake-model",
}


# -- Ollama ----------------------------------------------------------------------------------------

OLLAMA_TAGS = {
    "models": [
        {
            "name": "fake-model:latest",
            "model": "fake-model:latest",
            "modified_at": "2025-01-01T00:00:00Z",
            "size": 1,
            "digest": "0" * 64,
            "details": {"format": "gguf", "family": "fake", "parameter_size": "1B"},
        }
    ]
}


def ollama_line(req: dict[str, Any], message: dict[str, Any], done: bool) -> dict[str, Any]:
    return {
        "model": req.get("model", "fake-model"),
        "created_at": "2025-01-01T00:00:00Z",
        "message": message,
        "done": done,
    }


def ollama_done(llm: FakeLLM, req: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    """The last line of a stream: empty content, the counts (only here, as Ollama does)."""
    done = ollama_line(req, {"role": "assistant", "content": ""}, True)
    done |= {"done_reason": finish, "total_duration": 1000, "load_duration": 10}
    used = llm.usage()
    if used is not None:
        counts = {"prompt_eval_count": used[0], "eval_count": used[1]}
        done |= {**counts, "prompt_eval_duration": 100, "eval_duration": 200}
    if llm.mode == "null_error":
        done["error"] = None
    return done


def ollama_calls(llm: FakeLLM, req: dict[str, Any]) -> list[dict[str, Any]]:
    """The turn's calls by mode (arguments an object, no id: Ollama has none);
    none unless it proposes."""
    n = llm.next_id()
    if llm.mode not in CALLING:
        return []
    return [
        {"function": {"name": name, "arguments": json.loads(args)}}
        for _, name, args in llm.calls(req, n)
    ]


def ollama_answer(llm: FakeLLM, req: dict[str, Any]) -> dict[str, Any]:
    calls = ollama_calls(llm, req)
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    if llm.mode not in CALLING or llm.mode == "text_then_tool":
        message["content"] = llm.text()
    if calls:
        message["tool_calls"] = calls
    done = ollama_done(llm, req)
    return {**done, "message": message}


def ollama_events(llm: FakeLLM, req: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    """An Ollama chat stream: text lines, a line with the calls, the done line."""
    calls = ollama_calls(llm, req)
    if llm.mode not in CALLING or llm.mode == "text_then_tool":
        for part in _parts(llm):
            text = ollama_line(req, {"role": "assistant", "content": part}, False)
            yield "text", {**text, "error": None} if llm.mode == "null_error" else text
    if calls:
        message = {"role": "assistant", "content": "", "tool_calls": calls}
        yield None, ollama_line(req, message, False)
    yield None, ollama_done(llm, req)


# -- Gemini ------------------------------------------------------------------------------------


def gemini_answer(llm: FakeLLM, req: dict[str, Any], model: str) -> dict[str, Any]:
    """A ``GenerateContentResponse``: the call has no id, and a ``thoughtSignature``."""
    n = llm.next_id()
    parts: list[dict[str, Any]] = []
    if llm.mode not in CALLING or llm.mode == "text_then_tool":
        parts.append({"text": llm.text()})
    if llm.mode in CALLING:
        parts.extend(
            {
                "functionCall": {"name": name, "args": json.loads(args)},
                "thoughtSignature": SIGNATURE,
            }
            for _, name, args in llm.calls(req, n)
        )
    out: dict[str, Any] = {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "modelVersion": model,
        "responseId": f"resp-fake-{n}",
    }
    used = llm.usage()
    if used is not None:
        out["usageMetadata"] = (
            USAGE_GEMINI
            if used == (7, 3)
            else {
                "promptTokenCount": used[0],
                "candidatesTokenCount": used[1],
                "totalTokenCount": sum(used),
            }
        )
    if llm.mode == "null_error":
        out["error"] = None
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
        if llm.mode == "null_error":
            out["error"] = None
        if last:
            candidate["finishReason"] = "STOP"
            if "usageMetadata" in answer:
                out["usageMetadata"] = answer["usageMetadata"]
        return out

    if any("text" in p for p in parts):
        pieces = _parts(llm)
        for i, piece in enumerate(pieces):
            yield "text", chunk([{"text": piece}], not calls and i == len(pieces) - 1)
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
            if urlsplit(self.path).path == "/api/tags":
                return self._json(200, OLLAMA_TAGS)
            listing = self.path.partition("?")[0].endswith("/models")
            if listing and (llm.api == "gemini" or self.path.startswith("/v1beta/")):
                return self._json(200, gemini_models())
            if listing and self.headers.get("anthropic-version"):
                return self._json(200, MODEL_LIST_ANTHROPIC)
            if listing:
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

        def _stream(
            self, events: Iterator[tuple[str | None, Any]], named: bool, ndjson: bool = False
        ) -> None:
            self.send_response(200)
            kind = "application/x-ndjson" if ndjson else "text/event-stream; charset=utf-8"
            self.send_header("Content-Type", kind)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            texts = 0
            for tag, data in events:
                if llm.mode == "garbage" and tag == "text":
                    self._chunk(b"{not json\n" if ndjson else b"data: {not json\n\n")
                    break
                text = data if isinstance(data, str) else json.dumps(data)
                head = f"event: {data['type']}\n" if named and isinstance(data, dict) else ""
                if tag == "text" and texts == 0:
                    llm.first_text_at = time.perf_counter()
                framed = f"{text}\n" if ndjson else head + f"data: {text}\n\n"
                self._chunk(framed.encode())
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

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            req = json.loads(raw or b"{}")
            llm.bodies.append(raw)
            llm.requests.append(req)
            llm.paths.append(self.path)
            llm.auth.append(self.headers.get("Authorization"))
            llm.headers.append({k.lower(): v for k, v in self.headers.items()})
            turn = llm.for_request(req)
            path = urlsplit(self.path).path
            messages = path.endswith("/v1/messages")
            ollama = path == "/api/chat"
            model, _, method = path.rpartition("/models/")[2].rpartition(":")
            gemini = method in ("generateContent", "streamGenerateContent")
            failed = turn.error(anthropic=messages, ollama=ollama, gemini=gemini)
            if failed is not None:
                return self._json(*failed)
            if turn.mode == "502_html":
                page = b"<html><body>Bad gateway</body></html>"
                self.send_response(502)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return None
            if turn.mode == "slow":
                time.sleep(2)
            if gemini and method == "streamGenerateContent":
                return self._stream(gemini_events(turn, req, model), named=False)
            if ollama and req.get("stream") is not False:
                return self._stream(ollama_events(turn, req), named=False, ndjson=True)
            responses = path.endswith("/responses")
            known = ollama or gemini or responses or messages
            if not (known or path.endswith("/chat/completions")):
                return self._json(404, {"error": {"message": f"no route {self.path}"}})
            if req.get("stream") and not gemini:
                if messages:
                    return self._stream(messages_events(turn, req), named=True)
                events = responses_events(turn, req) if responses else chat_events(turn, req)
                return self._stream(events, named=responses)
            if turn.mode == "garbage":
                body = b"this is not json"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
            if messages:
                answer = messages_answer(turn, req)
            elif gemini:
                answer = gemini_answer(turn, req, model)
            elif ollama:
                answer = ollama_answer(turn, req)
            else:
                answer = responses_answer(turn, req) if responses else chat_answer(turn, req)
            if turn.mode == "big" and turn.gzip:
                body = gzip.compress(json.dumps(answer).encode(), compresslevel=9)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
            if turn.mode == "cut":
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return None
            return self._json(200, answer)

    return Handler


@contextmanager
def serve(host: str = "127.0.0.1", port: int = 0, api: str = "openai") -> Iterator[FakeLLM]:
    """Serve a :class:`FakeLLM` (its ``api``: the shape of a model list under
    ``/v1``) in a background thread for the duration of the block."""
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
    parser.add_argument(
        "--api", choices=APIS, default="openai", help="the API whose address to print"
    )
    parser.add_argument("--writes", type=int, default=1, help="write mode: tool outputs first")
    parser.add_argument("--fail-once", action="store_true", help="write mode: 500 once after")
    args = parser.parse_args()
    llm = FakeLLM()
    llm.mode = args.mode
    llm.writes, llm.fail_once = args.writes, args.fail_once
    llm.api = args.api
    server = _Server((args.host, args.port), _handler(llm))
    root = f"http://{args.host}:{args.port}"
    tail = "/v1" if args.api == "openai" else ""
    print(
        f"stand-in model ({args.mode}) on {root}{tail} ({args.api}); Anthropic's API on {root}",
        flush=True,
    )
    with suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
