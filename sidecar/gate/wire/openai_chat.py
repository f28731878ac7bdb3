"""OpenAI Chat Completions (``POST /chat/completions``), streamed or not.

Reads ``messages`` (the System Message is the first ``system`` /
``developer`` message; tool outputs are ``role: "tool"`` messages),
proposals in ``choices[].message.tool_calls`` (streamed: ``delta.tool_calls``
fragments by ``index``) and usage as ``total_tokens``. A stream forwarded
upstream always asks for its usage (``stream_options.include_usage``); the
agent sees the usage chunk only when it asked for it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.core.gate_writes import output_anchor, user_anchor
from sidecar.gate.wire import _openai
from sidecar.gate.wire._openai import OpenAIBase
from sidecar.gate.wire.base import (
    Answer,
    ErrorEvent,
    Final,
    Frame,
    Held,
    NotThisAnswer,
    Passed,
    Proposal,
    Spend,
    Stamp,
    StreamBroken,
    StreamEvent,
    ToolOutput,
    Usage,
    arguments_text,
    bad,
    json_frame,
    parse_args,
    sse,
    sse_frame,
)

ID_PREFIX = "chatcmpl-loopstop-"
ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
DONE = b"data: [DONE]\n\n"


def _choice(text: str) -> dict[str, Any]:
    return {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
        "logprobs": None,
    }


def _chunk(
    base: Mapping[str, Any], delta: dict[str, Any], finish: str | None, stamp: Stamp
) -> dict[str, Any]:
    return {
        "id": base.get("id") or stamp.id(ID_PREFIX),
        "object": "chat.completion.chunk",
        "created": base.get("created") or stamp.created,
        "model": base.get("model", ""),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def _final_chunks(base: Mapping[str, Any], text: str, stamp: Stamp) -> list[bytes]:
    delta = {"role": "assistant", "content": text}
    return [sse(_chunk(base, delta, None, stamp)), sse(_chunk(base, {}, "stop", stamp))]


def _usage_chunk(base: Mapping[str, Any], usage: Any, stamp: Stamp) -> bytes:
    return sse({**_chunk(base, {}, None, stamp), "choices": [], "usage": usage})


def _asked_usage(body: Mapping[str, Any]) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def _continuing(chunk: dict[str, Any], completion_id: Any, role_sent: bool) -> dict[str, Any]:
    """A follow-on stream's chunk as part of the completion ``completion_id``:
    that id, and no ``role`` in its deltas once the agent has been sent one."""
    out = {**chunk, "id": completion_id}
    choices = chunk.get("choices")
    if role_sent and isinstance(choices, list):
        out["choices"] = [
            {**c, "delta": {k: v for k, v in c["delta"].items() if k != "role"}}
            if isinstance(c, dict) and isinstance(c.get("delta"), dict)
            else c
            for c in choices
        ]
    return out


class ChatStream:
    """Reads a chat completion stream: content chunks pass, chunks carrying
    ``tool_calls`` (or ``finish_reason: tool_calls``) are held, the fragments
    of each call (by ``index``) are joined into its proposal, and the usage
    chunk is kept for the end (shown only when the agent asked for it).

    A follow-on stream (:meth:`follow_on`) continues the completion the agent
    is reading: its chunks take the first stream's ``id``, and lose their
    ``role`` once a chunk passed to the agent carried one.
    """

    def __init__(
        self,
        body: Mapping[str, Any],
        first: Mapping[str, Any] | None = None,
        role_sent: bool = False,
    ) -> None:
        self.asked = _asked_usage(body)
        self.parts: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.base: dict[str, Any] = dict(first or {})
        #: the id of the completion the agent is reading (a follow-on's chunks take it)
        self.continues: Any = None if first is None else first.get("id")
        #: a chunk that passed (not held) carried the ``role``
        self.role_sent = role_sent
        self.finished = False

    def feed(self, frame: Frame) -> list[StreamEvent]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.feed`."""
        if frame.data.strip() == "[DONE]":
            return [self.end()]
        chunk = json_frame(frame)
        if chunk.get("error") is not None:  # ``"error": null`` is no error
            return [ErrorEvent(sse_frame(frame))]
        self.base = self.base or chunk
        raw = sse_frame(frame)
        if self.continues is not None:
            chunk = _continuing(chunk, self.continues, self.role_sent)
            raw = sse(chunk)
        choices = chunk.get("choices")
        choices = choices if isinstance(choices, list) else []
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
            if not choices:
                return []  # sent at the end, when the client asked for it
            raw = sse({k: v for k, v in chunk.items() if k != "usage"})
        proposing = False
        chars = 0
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            if choice.get("finish_reason"):
                self.finished = True
            if choice.get("finish_reason") == "tool_calls":
                proposing = True
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    proposing = True
                    self._add(call)
            if isinstance(delta.get("content"), str):
                chars += len(delta["content"])
        if proposing:
            return [Held(raw, chars)]
        self.role_sent = self.role_sent or any(
            isinstance(c, dict) and isinstance(c.get("delta"), dict) and "role" in c["delta"]
            for c in choices
        )
        return [Passed(raw, chars)]

    def _add(self, call: Mapping[str, Any]) -> None:
        index = call.get("index")
        part = self.parts.setdefault(index if isinstance(index, int) else 0, {"args": ""})
        if call.get("id"):
            part["id"] = call["id"]
        fn = call.get("function")
        fn = fn if isinstance(fn, dict) else {}
        if fn.get("name"):
            part["name"] = fn["name"]
        if isinstance(fn.get("arguments"), str):
            part["args"] += fn["arguments"]

    def end(self) -> Final:
        """See :meth:`sidecar.gate.wire.base.StreamReader.end`."""
        if not self.finished:
            raise StreamBroken(
                "the upstream model's stream ended before its last chunk", "upstream_stream_cut"
            )
        calls = [
            Proposal(str(p.get("id") or ""), str(p.get("name") or ""), parse_args(p["args"]))
            for _, p in sorted(self.parts.items())
        ]
        return Final(calls, OpenAIChat.usage(self.usage))

    def finish(self, held: Sequence[Held], text: str | None, stamp: Stamp) -> list[bytes]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.finish`."""
        out = [h.raw for h in held] if text is None else _final_chunks(self.base, text, stamp)
        if self.asked and self.usage is not None:
            out.append(_usage_chunk(self.base, self.usage, stamp))
        out.append(DONE)
        return out

    def follow_on(self, body: Mapping[str, Any]) -> ChatStream:
        """See :meth:`sidecar.gate.wire.base.StreamReader.follow_on`: chunks of the
        next completion continue the same stream as they come (a client joins
        deltas; only this stream's ``[DONE]`` ends it)."""
        return ChatStream(body, self.base, self.role_sent)


class OpenAIChat(OpenAIBase):
    """The Chat Completions adapter (see the module's docstring)."""

    name = "chat"
    path = "/chat/completions"
    system_where = "the system message"

    def validate(self, body: Mapping[str, Any]) -> None:
        """``messages`` (each with a string ``role``), ``stream``, ``model``, ``stream_options``.

        :raises MalformedRequest: naming the field.
        """
        _openai.validate_common(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "must be a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad(f"messages.{i}.role", "each message needs a string role")
        if "stream_options" in body and not isinstance(body["stream_options"], dict | None):
            raise bad("stream_options", "must be an object")

    def system_texts(self, body: Mapping[str, Any]) -> list[str]:
        """The first ``system`` / ``developer`` message's text (n8n's System Message)."""
        for m in body.get("messages") or []:
            if _openai.is_system(m):
                return [_openai.text_of(m.get("content"))]
        return []

    def tool_outputs(self, body: Mapping[str, Any]) -> list[ToolOutput]:
        """The ``role: "tool"`` messages (``tool_call_id``, ``content``: a list of
        text parts is read as its text, as the model reads it)."""
        return [
            ToolOutput(m["tool_call_id"], _openai.parts_text(m.get("content")))
            for m in body.get("messages") or []
            if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str)
        ]

    def offered_tools(self, body: Mapping[str, Any]) -> frozenset[str] | None:
        """``tools[].function.name``."""
        tools = body.get("tools")
        if not isinstance(tools, list):
            return None
        names = set()
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.add(fn["name"])
        return frozenset(names)

    def spend(self, body: Mapping[str, Any]) -> Spend:
        """``n`` choices; media referenced in ``messages`` (see :func:`_openai.spend`)."""
        return _openai.spend(body, "messages")

    def with_output_limit(self, body: Mapping[str, Any], limit: int) -> dict[str, Any]:
        """``max_completion_tokens`` (what every current chat model takes)."""
        return {**body, "max_completion_tokens": limit}

    def read_answer(self, answer: Any) -> Answer:
        """``choices[].message.tool_calls`` and ``usage``.

        :raises NotThisAnswer: not an object with ``choices``.
        """
        if not isinstance(answer, dict) or "choices" not in answer:
            raise NotThisAnswer(
                "the upstream model answered something that is not a chat completion"
            )
        out: list[Proposal] = []
        choices = answer.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            message = choice.get("message") if isinstance(choice, dict) else None
            calls = message.get("tool_calls") if isinstance(message, dict) else None
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    fn = call.get("function")
                    fn = fn if isinstance(fn, dict) else {}
                    out.append(
                        Proposal(
                            str(call.get("id") or ""),
                            str(fn.get("name") or ""),
                            parse_args(fn.get("arguments")),
                        )
                    )
        return Answer(out, self.usage(answer.get("usage")))

    @staticmethod
    def usage(usage: Any) -> Usage:
        """``total_tokens``; priced by ``prompt_tokens`` / ``completion_tokens``."""
        return _openai.read_usage(usage, ("total_tokens",))

    def with_wrap_up(self, body: Mapping[str, Any], note: str) -> dict[str, Any]:
        """A last ``system`` message."""
        out = copy.copy(dict(body))
        out["messages"] = [*body["messages"], {"role": "system", "content": note}]
        return out

    def forward_payload(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """The body with ``model`` and, when streaming, ``stream_options.include_usage``."""
        payload = dict(body)
        if model:
            payload["model"] = model
        if self.streaming(body):
            payload["stream_options"] = {
                **(body.get("stream_options") or {}),
                "include_usage": True,
            }
        return payload

    def final_answer(self, text: str, model: str, stamp: Stamp) -> dict[str, Any]:
        """A chat completion with one final assistant message (``finish_reason: stop``)."""
        return {
            "id": stamp.id(ID_PREFIX),
            "object": "chat.completion",
            "created": stamp.created,
            "model": model,
            "choices": [_choice(text)],
            "usage": dict(ZERO_USAGE),
        }

    def final_stream(
        self, text: str, model: str, stamp: Stamp, body: Mapping[str, Any]
    ) -> list[bytes]:
        """A content chunk, a chunk with ``finish_reason: stop``, the usage chunk
        when the request asked for it, then ``[DONE]``."""
        base = {"id": stamp.id(ID_PREFIX), "created": stamp.created, "model": model}
        out = _final_chunks(base, text, stamp)
        if _asked_usage(body):
            out.append(_usage_chunk(base, dict(ZERO_USAGE), stamp))
        out.append(DONE)
        return out

    def replace_with_text(self, answer: Mapping[str, Any], text: str, stamp: Stamp) -> Any:
        """The completion with one choice: ``text``, ``finish_reason: stop``."""
        return {**answer, "choices": [_choice(text)]}

    def stream_reader(self, body: Mapping[str, Any]) -> ChatStream:
        """A :class:`ChatStream` for ``body``."""
        return ChatStream(body)

    # -- the gate's own exchanges ------------------------------------------------------

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """``messages``."""
        return list(body.get("messages") or [])

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The body with ``messages`` replaced."""
        return {**body, "messages": items}

    def item_anchor(self, item: Any) -> str | None:
        """A ``tool`` message's ``tool_call_id``, a ``user`` message's text."""
        if not isinstance(item, dict):
            return None
        if item.get("role") == "tool" and isinstance(item.get("tool_call_id"), str):
            return output_anchor(item["tool_call_id"])
        if item.get("role") == "user":
            return user_anchor(_openai.text_of(item.get("content")))
        return None

    def is_user_message(self, item: Any) -> bool:
        """``role: "user"``."""
        return isinstance(item, dict) and item.get("role") == "user"

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        """An assistant message with the one tool call, then its ``tool`` message."""
        call = {
            "id": proposal.call_id,
            "type": "function",
            "function": {"name": proposal.tool, "arguments": arguments_text(proposal.args)},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": proposal.call_id, "content": output_text},
        ]
