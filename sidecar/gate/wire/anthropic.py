"""The Anthropic Messages API (``POST /v1/messages``, ``GET /v1/models``), streamed or not:
what n8n's Anthropic Chat Model node (``@langchain/anthropic`` over
``@anthropic-ai/sdk``) sends, and Anthropic's own SDKs.

Reads the System Message from ``system`` (a string or text blocks), tool
outputs from ``tool_result`` blocks (``tool_use_id``) in user messages,
proposals from ``tool_use`` blocks, usage as ``input_tokens`` (from
``message_start`` when streamed) plus the last ``output_tokens`` (the
``message_delta`` value is cumulative). A stream is Server-Sent Events with
their ``event:`` names (Anthropic's clients dispatch on them): from the
first ``tool_use`` block on, every content event is held, so the events
keep their order whatever is decided; ``message_delta`` is held to the end.
The wrap-up note is appended to ``system`` (the Messages API has no system
role in ``messages``). Errors are ``{"type": "error", "error": {type, message}}``.

An exchange the gate answers itself (DESIGN §5.1) is an assistant message
with the one ``tool_use`` block, then a user message with its
``tool_result``; it is put back only between messages, after a user message
(the alternation the API requires: every ``tool_use`` answered in the next
message). A stream the gate asks again continues the one Message the
agent reads: no second ``message_start``, block indexes after the blocks
already passed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.core.gate_writes import output_anchor, user_anchor
from sidecar.gate.wire.base import (
    BEARER,
    MAX_OUTPUT_LIMIT,
    Answer,
    Api,
    ErrorEvent,
    Final,
    Frame,
    Framing,
    Held,
    NotThisAnswer,
    Passed,
    Proposal,
    Spend,
    Stamp,
    StreamBroken,
    StreamEvent,
    TokenFrom,
    ToolOutput,
    Usage,
    bad,
    check_int,
    json_frame,
    parse_args,
    sse,
    sse_frame,
    token_count,
)
from sidecar.gate.wire.conversation import Conversation

#: The version every Anthropic client sends; the default when a request sends none.
ANTHROPIC_VERSION = "2023-06-01"

#: The Anthropic API: the key in ``x-api-key``, the version headers passed on;
#: the token from ``x-api-key`` (n8n's node) or ``Authorization: Bearer`` (the SDKs'
#: ``auth_token``).
ANTHROPIC_API = Api(
    "anthropic",
    "x-api-key",
    pass_headers=("anthropic-version", "anthropic-beta"),
    default_headers=(("anthropic-version", ANTHROPIC_VERSION),),
    token_from=(TokenFrom("x-api-key"), BEARER),
)

ID_PREFIX = "msg_loopstop"
ZERO_USAGE = {"input_tokens": 0, "output_tokens": 0}

#: The Anthropic error ``type`` of an HTTP status (its "Errors" page, as its SDK's
#: ``ErrorResponse`` union has them); another 4xx is ``invalid_request_error``, a 5xx
#: ``api_error``.
_ERROR_TYPES = {
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_CONTENT_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop")


_count = token_count

#: Request fields whose cost is held or spent upstream, not bounded by the
#: request's bytes: a code-execution container's state, MCP servers Anthropic calls.
HELD_UPSTREAM = ("container", "mcp_servers")
#: Content block sources that reference their media instead of carrying it.
_REFERENCED_SOURCES = ("url", "file")


def _referenced(block: Any) -> bool:
    """A content block that references its media (an ``image`` or ``document``
    whose ``source`` is a URL or a Files API id, a ``container_upload``)."""
    if not isinstance(block, dict):
        return False
    if block.get("type") == "container_upload":
        return True
    source = block.get("source")
    return isinstance(source, dict) and source.get("type") in _REFERENCED_SOURCES


def _unbounded_block(messages: Any) -> str | None:
    """The dotted path of the first content block (or block of a ``tool_result``)
    whose media is referenced, None when there is none."""
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if _referenced(block):
                return f"messages.{i}.content.{j}"
            inner = block.get("content") if isinstance(block, dict) else None
            for k, part in enumerate(inner if isinstance(inner, list) else []):
                if _referenced(part):
                    return f"messages.{i}.content.{j}.content.{k}"
    return None


def _usage(input_tokens: int | None, output_tokens: int | None) -> Usage:
    if input_tokens is None or output_tokens is None:
        return Usage()
    return Usage(input_tokens + output_tokens, (input_tokens, output_tokens))


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "citations": None}


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _proposals(content: Any) -> list[Proposal]:
    return [
        Proposal(str(b.get("id") or ""), str(b.get("name") or ""), parse_args(b.get("input")))
        for b in _blocks(content)
        if b.get("type") == "tool_use"
    ]


def _error_type(code: str, status: int | None = None) -> str:
    if code == "timeout":
        return "timeout_error"
    if status is not None and status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if status is not None and status < 500 else "api_error"


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _text_events(text: str, index: int) -> list[bytes]:
    """The events of one text content block at ``index``."""
    return [
        sse(
            {"type": "content_block_start", "index": index, "content_block": _text_block("")},
            "content_block_start",
        ),
        sse(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": text},
            },
            "content_block_delta",
        ),
        sse({"type": "content_block_stop", "index": index}, "content_block_stop"),
    ]


def _end_events(delta: Mapping[str, Any] | None, stop_reason: str | None) -> list[bytes]:
    """``message_delta`` (the upstream's, its stop reason replaced when given), ``message_stop``."""
    base: dict[str, Any] = dict(delta or {})
    base["type"] = "message_delta"
    if stop_reason is not None or "delta" not in base:
        base["delta"] = {"stop_reason": stop_reason or "end_turn", "stop_sequence": None}
    base.setdefault("usage", {"output_tokens": 0})
    return [sse(base, "message_delta"), sse({"type": "message_stop"}, "message_stop")]


class MessagesStream:
    """Reads a Messages stream (see the module's docstring): ``message_start``,
    ``ping`` and content events before the first ``tool_use`` block pass; from
    it on, content events are held; ``message_delta`` is kept for the end and
    ``message_stop`` is the :class:`~sidecar.gate.wire.base.Final`.

    A follow-on stream (:meth:`follow_on`) drops its ``message_start`` and
    numbers its blocks from ``offset``, the blocks the agent already read."""

    def __init__(self, offset: int = 0, follow: bool = False) -> None:
        self.calls: dict[Any, dict[str, Any]] = {}
        self.holding_from: int | None = None
        self.next_index = offset
        self.offset = offset
        self.follow = follow
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.delta: dict[str, Any] | None = None

    def _read_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        found = _count(usage.get("input_tokens"))
        if found is not None:
            self.input_tokens = found
        found = _count(usage.get("output_tokens"))
        if found is not None:
            self.output_tokens = found

    def feed(self, frame: Frame) -> list[StreamEvent]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.feed`."""
        data = json_frame(frame)
        kind = str(data.get("type") or frame.event or "")
        if self.offset and isinstance(data.get("index"), int):
            data = {**data, "index": data["index"] + self.offset}
            raw = sse(data, frame.event or kind or None)
        else:
            raw = sse_frame(frame) if frame.event else sse(frame.data, kind or None)
        if kind == "error":
            return [ErrorEvent(raw)]
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                self._read_usage(message.get("usage"))
            return [] if self.follow else [Passed(raw)]
        if kind == "message_delta":
            self._read_usage(data.get("usage"))
            self.delta = data
            return []
        if kind == "message_stop":
            return [Final(self._proposals(), _usage(self.input_tokens, self.output_tokens))]
        if kind not in _CONTENT_EVENTS:
            return [Held(raw) if self.holding_from is not None else Passed(raw)]
        index = data.get("index")
        block = data.get("content_block")
        if kind == "content_block_start" and isinstance(block, dict):
            if isinstance(index, int):
                self.next_index = max(self.next_index, index + 1)
            if block.get("type") == "tool_use":
                self.calls[index] = {"id": block.get("id"), "name": block.get("name"), "json": ""}
                if self.holding_from is None:
                    self.holding_from = index if isinstance(index, int) else self.next_index - 1
        chars = 0
        delta = data.get("delta")
        if kind == "content_block_delta" and isinstance(delta, dict):
            if delta.get("type") == "input_json_delta" and index in self.calls:
                part = delta.get("partial_json")
                self.calls[index]["json"] += part if isinstance(part, str) else ""
            elif delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                chars = len(delta["text"])
        return [Held(raw, chars) if self.holding_from is not None else Passed(raw, chars)]

    def _proposals(self) -> list[Proposal]:
        """The ``tool_use`` blocks in the order they started, their input joined
        from the ``input_json_delta`` fragments (``{}`` when none came)."""
        return [
            Proposal(
                str(c.get("id") or ""),
                str(c.get("name") or ""),
                parse_args(c["json"] if c["json"].strip() else "{}"),
            )
            for c in self.calls.values()
        ]

    def end(self) -> Final:
        """See :meth:`sidecar.gate.wire.base.StreamReader.end`: always broken
        (a Messages stream ends with ``message_stop``)."""
        raise StreamBroken(
            "the upstream model's stream ended before message_stop", "upstream_stream_cut"
        )

    def finish(self, held: Sequence[Held], text: str | None, stamp: Stamp) -> list[bytes]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.finish`: the held events,
        ``message_delta`` and ``message_stop``; or, in place of the held
        events, one text block where they began and ``stop_reason: end_turn``."""
        if text is None:
            return [*(h.raw for h in held), *_end_events(self.delta, None)]
        index = self.holding_from if self.holding_from is not None else self.next_index
        return [*_text_events(text, index), *_end_events(self.delta, "end_turn")]

    def follow_on(self, body: Mapping[str, Any]) -> MessagesStream:
        """See :meth:`sidecar.gate.wire.base.StreamReader.follow_on`: the next
        Message's blocks come after the ones passed (this stream's held blocks,
        from ``holding_from`` on, were never sent)."""
        passed = self.holding_from if self.holding_from is not None else self.next_index
        return MessagesStream(passed, follow=True)


class AnthropicMessages(Conversation):
    """The Messages API adapter (see the module's docstring)."""

    name = "messages"
    api = ANTHROPIC_API
    path = "/v1/messages"
    framing = Framing.SSE
    system_where = "system"
    models_path = "/v1/models"

    def validate(self, body: Mapping[str, Any]) -> None:
        """``messages`` (each with a string ``role`` and a string or list ``content``),
        ``system`` (a string or a list of blocks), ``stream``, ``model``,
        ``max_tokens`` (an integer from 1 to
        :data:`~sidecar.gate.wire.base.MAX_OUTPUT_LIMIT`), ``tools``.

        :raises MalformedRequest: naming the field.
        """
        if "stream" in body and not isinstance(body["stream"], bool):
            raise bad("stream", "must be a boolean")
        if "model" in body and not isinstance(body["model"], str):
            raise bad("model", "must be a string")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "must be a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad(f"messages.{i}.role", "each message needs a string role")
            if not isinstance(m.get("content"), str | list):
                raise bad(f"messages.{i}.content", "must be a string or a list of blocks")
        system = body.get("system")
        if system is not None and not (
            isinstance(system, str)
            or (isinstance(system, list) and all(isinstance(b, dict) for b in system))
        ):
            raise bad("system", "must be a string or a list of text blocks")
        check_int(body.get("max_tokens"), "max_tokens", 1, MAX_OUTPUT_LIMIT)
        if "tools" in body and not isinstance(body["tools"], list | None):
            raise bad("tools", "must be a list of tools")

    def streaming(self, body: Mapping[str, Any]) -> bool:
        """``stream: true``."""
        return bool(body.get("stream"))

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The body's ``model``."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def system_texts(self, body: Mapping[str, Any]) -> list[str]:
        """``system``: the string, or its text blocks' texts."""
        system = body.get("system")
        if isinstance(system, str):
            return [system]
        return [
            b["text"]
            for b in _blocks(system)
            if b.get("type") == "text" and isinstance(b.get("text"), str)
        ]

    def tool_outputs(self, body: Mapping[str, Any]) -> list[ToolOutput]:
        """The ``tool_result`` blocks of the user messages (``tool_use_id``, ``content``)."""
        return [
            ToolOutput(b["tool_use_id"], b.get("content"))
            for m in body.get("messages") or []
            if m.get("role") == "user"
            for b in _blocks(m.get("content"))
            if b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str)
        ]

    def offered_tools(self, body: Mapping[str, Any]) -> frozenset[str] | None:
        """``tools[].name`` of the client tools (no ``type``, or ``custom``): the ones a
        ``tool_use`` block may name. Anthropic's server tools (``web_search_...``)
        run at Anthropic and come back as ``server_tool_use``, never to n8n."""
        tools = body.get("tools")
        if not isinstance(tools, list):
            return None
        return frozenset(
            t["name"]
            for t in tools
            if isinstance(t, dict)
            and t.get("type", "custom") in ("custom", None)
            and isinstance(t.get("name"), str)
        )

    def number_calls(self, body: Mapping[str, Any], proposals: list[Proposal]) -> list[Proposal]:
        """The proposals as they are: Anthropic gives every ``tool_use`` block its id."""
        return proposals

    def max_output_tokens(self, body: Mapping[str, Any]) -> int | None:
        """``max_tokens``."""
        value = body.get("max_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def spend(self, body: Mapping[str, Any]) -> Spend:
        """One choice (the Messages API has no ``n``); unbounded: a field whose cost
        is held or spent upstream (``container``, ``mcp_servers``), a server tool
        (``tools.<i>.type`` other than ``custom``: web search, code execution, and
        the Anthropic-defined tools, which add a system prompt of their own), or
        media referenced by URL or file id (an ``image``/``document`` block's
        ``source``, a ``container_upload``)."""
        for name in HELD_UPSTREAM:
            if body.get(name) not in (None, "", [], {}):
                return Spend(unbounded=name)
        tools = body.get("tools")
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            if isinstance(tool, dict) and tool.get("type", "custom") not in ("custom", None):
                return Spend(unbounded=f"tools.{i}.type")
        return Spend(unbounded=_unbounded_block(body.get("messages")))

    def with_output_limit(self, body: Mapping[str, Any], limit: int) -> dict[str, Any]:
        """``max_tokens`` (the API requires it: an Anthropic turn is always bounded)."""
        return {**body, "max_tokens": limit}

    def read_answer(self, answer: Any) -> Answer:
        """The ``tool_use`` blocks of ``content`` and ``usage``.

        :raises NotThisAnswer: not a ``message`` object with ``content``.
        """
        if (
            not isinstance(answer, dict)
            or answer.get("type", "message") != "message"
            or not isinstance(answer.get("content"), list)
        ):
            raise NotThisAnswer("the upstream model answered something that is not a Message")
        return Answer(_proposals(answer["content"]), self.usage(answer.get("usage")))

    @staticmethod
    def usage(usage: Any) -> Usage:
        """``input_tokens + output_tokens`` (DESIGN §5), priced by the two."""
        if not isinstance(usage, dict):
            return Usage()
        return _usage(_count(usage.get("input_tokens")), _count(usage.get("output_tokens")))

    def with_wrap_up(self, body: Mapping[str, Any], note: str) -> dict[str, Any]:
        """``note`` appended to ``system`` (a paragraph of the string, or a last text block)."""
        out = copy.copy(dict(body))
        system = body.get("system")
        if isinstance(system, list):
            out["system"] = [*system, {"type": "text", "text": note}]
        elif isinstance(system, str) and system:
            out["system"] = f"{system}\n\n{note}"
        else:
            out["system"] = note
        return out

    def forward_payload(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """The body with ``model`` (a Messages stream always reports its usage)."""
        payload = dict(body)
        if model:
            payload["model"] = model
        return payload

    def final_answer(self, text: str, model: str, stamp: Stamp) -> dict[str, Any]:
        """A Message with one text block (``stop_reason: end_turn``)."""
        return {
            "id": stamp.id(ID_PREFIX),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [_text_block(text)],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": dict(ZERO_USAGE),
        }

    def final_stream(
        self, text: str, model: str, stamp: Stamp, body: Mapping[str, Any]
    ) -> list[bytes]:
        """``message_start``, one text block's events, ``message_delta``, ``message_stop``."""
        started = {**self.final_answer(text, model, stamp), "content": [], "stop_reason": None}
        return [
            sse({"type": "message_start", "message": started}, "message_start"),
            *_text_events(text, 0),
            *_end_events({"usage": {"output_tokens": 0}}, "end_turn"),
        ]

    def replace_with_text(self, answer: Mapping[str, Any], text: str, stamp: Stamp) -> Any:
        """The Message with ``content`` one text block and ``stop_reason: end_turn``."""
        return {**answer, "content": [_text_block(text)], "stop_reason": "end_turn"}

    def error_body(self, message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
        """Anthropic's error (``{"type": "error", "error": {type, message}}``); ``type``
        ``timeout_error`` for a timeout, else ``api_error``."""
        return _error(message, _error_type(code))

    def upstream_error_body(self, status: int, answer: Any) -> dict[str, Any]:
        """The upstream's own body when it is Anthropic's error, else one naming ``status``."""
        if (
            isinstance(answer, dict)
            and answer.get("type") == "error"
            and isinstance(answer.get("error"), dict)
        ):
            return answer
        return _error(f"the upstream model answered {status}", _error_type("", status))

    def error_event(self, message: str, code: str) -> bytes:
        """An ``event: error`` (Anthropic's clients raise it mid-stream)."""
        return sse(_error(message, _error_type(code)), "error")

    def stream_reader(self, body: Mapping[str, Any]) -> MessagesStream:
        """A :class:`MessagesStream`."""
        return MessagesStream()

    def model_list(self, listed: Any, default_model: str) -> dict[str, Any]:
        """``GET /v1/models``: the upstream's list, or one naming ``default_model``."""
        if isinstance(listed, dict) and isinstance(listed.get("data"), list):
            return listed
        model = {
            "type": "model",
            "id": default_model,
            "display_name": default_model,
            "created_at": "1970-01-01T00:00:00Z",
            "lifecycle": "active",
        }
        return {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}

    # -- the gate's own exchanges ------------------------------------------------------

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """``messages``."""
        return list(body.get("messages") or [])

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The body with ``messages`` replaced."""
        return {**body, "messages": items}

    def item_anchor(self, item: Any) -> str | None:
        """A user message's last ``tool_result`` (its ``tool_use_id``), else its text;
        None for the others (an exchange goes back only after a user message)."""
        if not isinstance(item, dict) or item.get("role") != "user":
            return None
        blocks = _blocks(item.get("content"))
        results = [
            b["tool_use_id"]
            for b in blocks
            if b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str)
        ]
        if results:
            return output_anchor(results[-1])
        return user_anchor(_text_of(blocks))

    def is_user_message(self, item: Any) -> bool:
        """A user message holding no ``tool_result`` block."""
        return (
            isinstance(item, dict)
            and item.get("role") == "user"
            and not any(b.get("type") == "tool_result" for b in _blocks(item.get("content")))
        )

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        """An assistant message with the one ``tool_use`` block (its ``input`` an
        object, as the API requires), then a user message with its ``tool_result``."""
        args = proposal.args if isinstance(proposal.args, dict) else {}
        use = {"type": "tool_use", "id": proposal.call_id, "name": proposal.tool, "input": args}
        result = {"type": "tool_result", "tool_use_id": proposal.call_id, "content": output_text}
        return [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]


def _text_of(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The texts of a message's text blocks, joined."""
    return "".join(
        b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
    )
