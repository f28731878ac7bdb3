"""The OpenAI Responses API (``POST /responses``), streamed or not: the
default of n8n 2.x's OpenAI Chat Model node from typeVersion 1.3.

Reads ``input`` (a string, or items: the System Message is ``instructions``
or the first ``system`` / ``developer`` message item; tool outputs are
``function_call_output`` items), proposals as ``function_call`` output items
(streamed: ``response.output_item.*`` and
``response.function_call_arguments.*`` events, held), usage as
``input_tokens + output_tokens`` from the answer or ``response.completed``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
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

_CALL_EVENTS = ("response.function_call_arguments.delta", "response.function_call_arguments.done")
_FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
_START_EVENTS = ("response.created", "response.in_progress")
#: The usage of an answer the gate writes itself (the Responses API's usage object
#: has its details members: the SDK's ``ResponseUsage`` requires them).
ZERO_USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}


def _message_item(text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _counter(start: int = 0) -> Callable[[], int]:
    n = [start - 1]

    def nxt() -> int:
        n[0] += 1
        return n[0]

    return nxt


def _message_events(
    text: str, output_index: int, seq: Callable[[], int], item_id: str
) -> tuple[list[bytes], dict[str, Any]]:
    """The events that add one assistant message to a streamed Response, and the item."""
    item = _message_item(text, item_id)
    part = item["content"][0]
    at = {"item_id": item_id, "output_index": output_index, "content_index": 0}

    def ev(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": seq(), **fields}, kind)

    events = [
        ev(
            "response.output_item.added",
            output_index=output_index,
            item={**_message_item("", item_id, "in_progress"), "content": []},
        ),
        ev("response.content_part.added", **at, part={**part, "text": ""}),
        ev("response.output_text.delta", **at, delta=text, logprobs=[]),
        ev("response.output_text.done", **at, text=text, logprobs=[]),
        ev("response.content_part.done", **at, part=part),
        ev("response.output_item.done", output_index=output_index, item=item),
    ]
    return events, item


def _is_call(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "function_call"


def _proposal(item: Mapping[str, Any]) -> Proposal:
    return Proposal(
        str(item.get("call_id") or ""),
        str(item.get("name") or ""),
        parse_args(item.get("arguments")),
    )


def _proposals(response: Mapping[str, Any]) -> list[Proposal]:
    output = response.get("output")
    return [
        _proposal(item) for item in (output if isinstance(output, list) else []) if _is_call(item)
    ]


class ResponsesStream:
    """Reads a Responses stream: events of ``function_call`` items are held,
    the others pass; the final event (``response.completed``, ``.incomplete``,
    ``.failed``) carries the usage. The proposals are the calls the item events
    streamed (what a client builds its tool calls from: ``output_item.added``,
    the argument deltas, ``output_item.done``), then any call of the final
    event's ``output`` they did not: every call relayed is a call decided.

    A follow-on stream (:meth:`follow_on`) continues the answer the agent is
    reading: its ``response.created`` / ``response.in_progress`` are dropped,
    its ``output_index`` values come after the items already passed and its
    ``sequence_number`` values after the last one sent.
    """

    def __init__(self, offset: int = 0, seq_base: int | None = None) -> None:
        #: the streamed function_call items by output_index, arguments joined
        self.calls: dict[Any, dict[str, Any]] = {}
        self.last_seq = 0
        self.final: tuple[Frame, dict[str, Any], dict[str, Any]] | None = None
        #: output items before this stream's (passed by earlier streams of the request)
        self.offset = offset
        #: None: the first stream (events pass unchanged); else numbering continues here
        self.seq_base = seq_base
        self.passed_items: set[Any] = set()
        self.sent_seq = seq_base - 1 if seq_base is not None else 0

    def _raw(self, frame: Frame, data: dict[str, Any]) -> bytes:
        """The frame as it goes out: unchanged, or renumbered in a follow-on stream."""
        if self.seq_base is None:
            if isinstance(data.get("sequence_number"), int):
                self.sent_seq = data["sequence_number"]
            return sse_frame(frame)
        out = dict(data)
        if isinstance(out.get("output_index"), int):
            out["output_index"] += self.offset
        if isinstance(out.get("sequence_number"), int):
            out["sequence_number"] += self.seq_base
            self.sent_seq = out["sequence_number"]
        return sse(out, frame.event)

    def _streamed(self, kind: str, data: Mapping[str, Any]) -> None:
        at = data.get("output_index")
        item = data.get("item")
        if kind.startswith("response.output_item.") and isinstance(item, dict):
            known = self.calls.setdefault(at, {"arguments": ""})
            args = item.get("arguments")
            known.update({k: v for k, v in item.items() if k != "arguments"})
            if isinstance(args, str) and (args or kind.endswith(".done")):
                known["arguments"] = args
        elif kind == _CALL_EVENTS[0] and isinstance(data.get("delta"), str):
            self.calls[at]["arguments"] = str(self.calls[at].get("arguments", "")) + data["delta"]
        elif kind == _CALL_EVENTS[1] and isinstance(data.get("arguments"), str):
            self.calls[at]["arguments"] = data["arguments"]

    def _final_proposals(self, response: Mapping[str, Any]) -> list[Proposal]:
        streamed = [_proposal(item) for _, item in sorted(self.calls.items(), key=_order)]
        ids = {p.call_id for p in streamed}
        return [*streamed, *(p for p in _proposals(response) if p.call_id not in ids)]

    def feed(self, frame: Frame) -> list[StreamEvent]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.feed`."""
        data = json_frame(frame)
        kind = str(data.get("type") or frame.event or "message")
        if isinstance(data.get("sequence_number"), int):
            self.last_seq = data["sequence_number"]
        if kind == "error":
            return [ErrorEvent(self._raw(frame, data))]
        if kind in _FINAL_EVENTS:
            response = data.get("response")
            if not isinstance(response, dict):
                raise StreamBroken(
                    "the upstream model sent an unreadable final event", "bad_upstream_response"
                )
            self.final = (frame, data, response)
            usage = OpenAIResponses.usage(response.get("usage"))
            return [Final(self._final_proposals(response), usage)]
        if self.seq_base is not None and kind in _START_EVENTS:
            return []
        item = data.get("item")
        if kind.startswith("response.output_item.") and _is_call(item):
            self._streamed(kind, data)
            return [Held(self._raw(frame, data))]
        if kind in _CALL_EVENTS and data.get("output_index") in self.calls:
            self._streamed(kind, data)
            return [Held(self._raw(frame, data))]
        if kind == "response.output_item.added":
            self.passed_items.add(data.get("output_index"))
        chars = 0
        if kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            chars = len(data["delta"])
        return [Passed(self._raw(frame, data), chars)]

    def end(self) -> Final:
        """See :meth:`sidecar.gate.wire.base.StreamReader.end`: always broken
        (a Responses stream ends with its final event)."""
        raise StreamBroken(
            "the upstream model's stream ended before response.completed", "upstream_stream_cut"
        )

    def finish(self, held: Sequence[Held], text: str | None, stamp: Stamp) -> list[bytes]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.finish`: the held events
        and the final event; or a message item in place of the calls and a
        ``response.completed`` holding it."""
        assert self.final is not None, "finish follows the Final event"
        frame, data, response = self.final
        if text is None:
            return [*(h.raw for h in held), self._raw(frame, data)]
        kept = [i for i in response.get("output") or [] if not _is_call(i)]
        seq = _counter(max(self.last_seq + (self.seq_base or 0), self.sent_seq) + 1)
        at = self.offset + len(kept)
        events, item = _message_events(text, at, seq, stamp.id("msg_loopstop"))
        done = {**response, "output": [*kept, item], "status": "completed"}
        completed = {**data, "type": "response.completed", "sequence_number": seq()}
        return [*events, sse({**completed, "response": done}, "response.completed")]

    def follow_on(self, body: Mapping[str, Any]) -> ResponsesStream:
        """See :meth:`sidecar.gate.wire.base.StreamReader.follow_on`."""
        return ResponsesStream(self.offset + len(self.passed_items), self.sent_seq + 1)


def _order(entry: tuple[Any, dict[str, Any]]) -> tuple[int, str]:
    at = entry[0]
    return (at, "") if isinstance(at, int) and not isinstance(at, bool) else (1 << 62, str(at))


class OpenAIResponses(OpenAIBase):
    """The Responses API adapter (see the module's docstring)."""

    name = "responses"
    path = "/responses"
    system_where = "instructions or a system message"

    def validate(self, body: Mapping[str, Any]) -> None:
        """``input`` (a string, or a non-empty list of objects), ``instructions``,
        ``stream``, ``model``.

        :raises MalformedRequest: naming the field.
        """
        _openai.validate_common(body)
        given = body.get("input")
        if isinstance(given, str):
            if not given and not body.get("instructions"):
                raise bad("input", "must not be empty")
        elif isinstance(given, list):
            if not given:
                raise bad("input", "must be a non-empty list of items")
            for i, item in enumerate(given):
                if not isinstance(item, dict):
                    raise bad(f"input.{i}", "each input item must be an object")
        else:
            raise bad("input", "must be a string or a list of input items")
        if "instructions" in body and not isinstance(body["instructions"], str | None):
            raise bad("instructions", "must be a string")

    def system_texts(self, body: Mapping[str, Any]) -> list[str]:
        """``instructions`` when given, else the first ``system`` / ``developer``
        input item's text (n8n's System Message)."""
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            return [body["instructions"]]
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if _openai.is_system(item):
                return [_openai.text_of(item.get("content"))]
        return []

    def tool_outputs(self, body: Mapping[str, Any]) -> list[ToolOutput]:
        """The ``function_call_output`` items (``call_id``, ``output``)."""
        items = body.get("input")
        return [
            ToolOutput(item["call_id"], item.get("output"))
            for item in (items if isinstance(items, list) else [])
            if item.get("type") == "function_call_output" and isinstance(item.get("call_id"), str)
        ]

    def offered_tools(self, body: Mapping[str, Any]) -> frozenset[str] | None:
        """``tools[].name`` of the ``function`` tools."""
        tools = body.get("tools")
        if not isinstance(tools, list):
            return None
        return frozenset(
            t["name"]
            for t in tools
            if isinstance(t, dict)
            and t.get("type") == "function"
            and isinstance(t.get("name"), str)
        )

    def spend(self, body: Mapping[str, Any]) -> Spend:
        """Context held upstream, hosted tools, media referenced in ``input``
        (see :func:`_openai.spend`)."""
        return _openai.spend(body, "input")

    def with_output_limit(self, body: Mapping[str, Any], limit: int) -> dict[str, Any]:
        """``max_output_tokens``."""
        return {**body, "max_output_tokens": limit}

    def read_answer(self, answer: Any) -> Answer:
        """``output[]`` items of type ``function_call`` and ``usage``.

        :raises NotThisAnswer: not an object with ``output``.
        """
        if not isinstance(answer, dict) or "output" not in answer:
            raise NotThisAnswer("the upstream model answered something that is not a Response")
        return Answer(_proposals(answer), self.usage(answer.get("usage")))

    @staticmethod
    def usage(usage: Any) -> Usage:
        """``input_tokens + output_tokens``."""
        return _openai.read_usage(usage, ("input_tokens", "output_tokens"))

    def with_wrap_up(self, body: Mapping[str, Any], note: str) -> dict[str, Any]:
        """A last ``system`` message item (a string ``input`` becomes a user item first)."""
        out = copy.copy(dict(body))
        item = {"type": "message", "role": "system", "content": note}
        if isinstance(body.get("input"), list):
            out["input"] = [*body["input"], item]
        else:
            out["input"] = [{"type": "message", "role": "user", "content": body["input"]}, item]
        return out

    def forward_payload(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """The body with ``model`` (a Response's stream reports its usage)."""
        payload = dict(body)
        if model:
            payload["model"] = model
        return payload

    def final_answer(self, text: str, model: str, stamp: Stamp) -> dict[str, Any]:
        """A Response whose ``output`` is one assistant message (``status: completed``)."""
        return {
            "id": stamp.id("resp_loopstop"),
            "object": "response",
            "created_at": stamp.created,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "model": model,
            "output": [_message_item(text, stamp.id("msg_loopstop"))],
            "output_text": text,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": copy.deepcopy(ZERO_USAGE),
            "metadata": {},
        }

    def final_stream(
        self, text: str, model: str, stamp: Stamp, body: Mapping[str, Any]
    ) -> list[bytes]:
        """``response.created``, ``response.in_progress``, one message's events,
        ``response.completed``."""
        done = self.final_answer(text, model, stamp)
        seq = _counter()
        started = {**done, "status": "in_progress", "output": [], "usage": None}
        started.pop("output_text", None)
        out = [
            sse(
                {"type": kind, "sequence_number": seq(), "response": started},
                kind,
            )
            for kind in ("response.created", "response.in_progress")
        ]
        events, item = _message_events(text, 0, seq, stamp.id("msg_loopstop"))
        out.extend(events)
        done["output"] = [item]
        out.append(
            sse(
                {"type": "response.completed", "sequence_number": seq(), "response": done},
                "response.completed",
            )
        )
        return out

    def replace_with_text(self, answer: Mapping[str, Any], text: str, stamp: Stamp) -> Any:
        """The Response with ``output`` one message, ``output_text`` and ``status: completed``."""
        out = dict(answer)
        out["output"] = [_message_item(text, stamp.id("msg_loopstop"))]
        out["output_text"] = text
        out["status"] = "completed"
        return out

    def stream_reader(self, body: Mapping[str, Any]) -> ResponsesStream:
        """A :class:`ResponsesStream`."""
        return ResponsesStream()

    # -- the gate's own exchanges ------------------------------------------------------

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """``input`` items (a string ``input`` as one user message item)."""
        given = body.get("input")
        if isinstance(given, list):
            return list(given)
        return [{"type": "message", "role": "user", "content": given}] if given else []

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The body with ``input`` replaced."""
        return {**body, "input": items}

    def item_anchor(self, item: Any) -> str | None:
        """A ``function_call_output``'s ``call_id``, a user message's text."""
        if not isinstance(item, dict):
            return None
        if item.get("type") == "function_call_output" and isinstance(item.get("call_id"), str):
            return output_anchor(item["call_id"])
        if self.is_user_message(item):
            return user_anchor(_openai.text_of(item.get("content")))
        return None

    def is_user_message(self, item: Any) -> bool:
        """A ``message`` item with ``role: "user"``."""
        return (
            isinstance(item, dict)
            and item.get("role") == "user"
            and item.get("type", "message") == "message"
        )

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        """A ``function_call`` item, then its ``function_call_output``."""
        return [
            {
                "type": "function_call",
                "call_id": proposal.call_id,
                "name": proposal.tool,
                "arguments": arguments_text(proposal.args),
            },
            {"type": "function_call_output", "call_id": proposal.call_id, "output": output_text},
        ]
