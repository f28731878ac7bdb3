"""Ollama's chat API (``POST /api/chat``), streamed (NDJSON, its default) or not.

Reads ``messages`` (the System Message is the first ``role: "system"``
message; tool outputs are ``role: "tool"`` messages), proposals in
``message.tool_calls`` (``function.arguments`` is an object, not a string)
and usage as ``prompt_eval_count + eval_count``. A stream is one JSON
object per line, ending at the first ``done: true`` line; a line with an
``error`` member that is not null is the upstream's error (the client
raises it); a null one is dropped from the line relayed.

The API gives calls no id, and n8n's echo of an earlier call carries an id
of LangChain's own (its tool messages carry none): the adapter numbers the
calls of a conversation in order, and a ``role: "tool"`` message answers the
next unanswered call of the assistant message before it (by ``tool_name``
when the message names one), so an id is the same in every later request.
An id is ``ollama_<digest>_<n>``: ``n`` counts the conversation's calls, the
digest is that of its opening (the messages before its first call), so two
conversations of one task (two executions, a re-run with another opening)
do not share ids. Two executions with the very same opening do; a
``loopstop-execution`` line in the System Message tells them apart.

An exchange the gate answers itself (DESIGN §5.1) is an assistant message
whose one call carries the gate's own id
(:func:`~sidecar.core.gate_writes.own_call_id`), then its ``role: "tool"``
message (with ``tool_name``). Such calls are never counted: a gate-answered
exchange does not shift the numbers of the calls n8n sees, whether it was
put in by this request or put back from an earlier one. The conversation
the gate splices is made of :class:`Item` values that keep an assistant
message with calls together with the tool messages answering it (an
exchange never goes between a call and its output); such a group's anchor
is the id of its last call, which a later request numbers the same.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.canonical import canonical_json
from sidecar.core.gate_writes import is_own_call_id, output_anchor, user_anchor
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
    ToolOutput,
    Usage,
    bad,
    check_int,
    json_frame,
    parse_args,
    rfc3339,
    token_count,
)
from sidecar.gate.wire.conversation import Conversation

#: The timings of an answer the gate writes itself (nanoseconds, all zero).
ZERO_TIMINGS = {
    "total_duration": 0,
    "load_duration": 0,
    "prompt_eval_count": 0,
    "prompt_eval_duration": 0,
    "eval_count": 0,
    "eval_duration": 0,
}
#: Ollama's API: n8n's credential sends its API Key (the loopstop token) as a
#: bearer token, and only when it is set; a local Ollama wants no key at all.
OLLAMA_API = Api("ollama", "Authorization", "Bearer ", token_from=(BEARER,))
#: Hex digits of the conversation's digest in a call id.
DIGEST_HEX = 12


def line(data: Mapping[str, Any]) -> bytes:
    """One NDJSON line (compact JSON, then ``\\n``)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def _calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's (or an answer's) ``tool_calls`` entries."""
    if message.get("role") not in ("assistant", None):
        return []
    calls = message.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _own(message: Mapping[str, Any]) -> bool:
    """An assistant message of an exchange the gate answered itself."""
    calls = _calls(message)
    return bool(calls) and all(is_own_call_id(c.get("id")) for c in calls)


def _groups(messages: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], ...]]:
    """The messages, each alone, but an assistant message with calls together with
    the ``role: "tool"`` messages right after it (at most one per call)."""
    out: list[tuple[dict[str, Any], ...]] = []
    i = 0
    while i < len(messages):
        calls = _calls(messages[i])
        j = i + 1
        while calls and j < len(messages) and messages[j].get("role") == "tool":
            if j - i > len(calls):
                break
            j += 1
        out.append(tuple(messages[i:j]))
        i = j
    return out


def _seen(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages n8n sent: without the gate's own exchanges."""
    return [m for group in _groups(messages) if not _own(group[0]) for m in group]


def _name(call: Mapping[str, Any]) -> str:
    fn = call.get("function")
    return str(fn.get("name") or "") if isinstance(fn, dict) else ""


def _proposal(call: Mapping[str, Any]) -> Proposal:
    fn = call.get("function")
    args = fn.get("arguments") if isinstance(fn, dict) else None
    return Proposal("", _name(call), parse_args(args))


def _digest(messages: Sequence[Mapping[str, Any]]) -> str:
    """The digest of a conversation's opening: its messages before the first call or tool output."""
    opening: list[Any] = []
    for m in messages:
        if m.get("role") == "tool" or _calls(m):
            break
        opening.append(m)
    try:
        text = canonical_json(opening)
    except (ValueError, TypeError, RecursionError):  # a value RFC 8785 cannot write
        text = json.dumps(opening, sort_keys=True, default=repr).encode()
    return hashlib.sha256(text).hexdigest()[:DIGEST_HEX]


def call_id(digest: str, n: int) -> str:
    """The id of the conversation's ``n``-th call (from 0)."""
    return f"ollama_{digest}_{n}"


_count = token_count


def _created_at(stamp: Stamp) -> str:
    return rfc3339(stamp.created)


def _text_line(base: Mapping[str, Any], text: str, stamp: Stamp) -> bytes:
    return line(
        {
            "model": base.get("model", ""),
            "created_at": base.get("created_at") or _created_at(stamp),
            "message": {"role": "assistant", "content": text},
            "done": False,
        }
    )


class OllamaStream:
    """Reads an Ollama chat stream: lines of text pass, lines carrying
    ``message.tool_calls`` are held, and the ``done: true`` line ends the
    turn with the proposals and its counts (kept to close the stream)."""

    def __init__(self) -> None:
        self.proposals: list[Proposal] = []  # (a follow-on stream is a new reader)
        self.base: dict[str, Any] = {}
        self.done: dict[str, Any] | None = None

    def feed(self, frame: Frame) -> list[StreamEvent]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.feed`."""
        data = json_frame(frame)
        if data.get("error") is not None:  # ``"error": null`` is no error
            return [ErrorEvent(frame.data.encode() + b"\n")]
        raw = frame.data.encode() + b"\n"
        if "error" in data:  # null: not relayed either (a client may test for the key)
            data = {k: v for k, v in data.items() if k != "error"}
            raw = line(data)
        self.base = self.base or data
        message = data.get("message")
        message = message if isinstance(message, dict) else {}
        calls = _calls(message)
        self.proposals.extend(_proposal(c) for c in calls)
        if data.get("done") is True:
            self.done = data
            return [Final(list(self.proposals), Ollama.usage(data))]
        chars = sum(
            len(message[k]) for k in ("content", "thinking") if isinstance(message.get(k), str)
        )
        return [Held(raw, chars) if calls else Passed(raw, chars)]

    def end(self) -> Final:
        """See :meth:`sidecar.gate.wire.base.StreamReader.end`: always broken
        (an Ollama stream ends with its ``done: true`` line)."""
        raise StreamBroken(
            "the upstream model's stream ended before its done line", "upstream_stream_cut"
        )

    def finish(self, held: Sequence[Held], text: str | None, stamp: Stamp) -> list[bytes]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.finish`: the held lines
        and the done line; or ``text`` as one line in place of the calls and the
        done line without them (its counts kept: the client adds up every line's)."""
        assert self.done is not None, "finish follows the done line"
        if text is None:
            return [*(h.raw for h in held), line(self.done)]
        done = {
            **self.done,
            "message": {"role": "assistant", "content": ""},
            "done_reason": "stop",
        }
        return [_text_line(self.base, text, stamp), line(done)]

    def follow_on(self, body: Mapping[str, Any]) -> OllamaStream:
        """See :meth:`sidecar.gate.wire.base.StreamReader.follow_on`: NDJSON lines
        stand alone, so the next stream's lines continue as they come (only the
        last stream's done line ends the answer)."""
        return OllamaStream()


@dataclass(frozen=True)
class Item:
    """One item of the conversation the gate splices (see the module's
    docstring): its messages, its anchor, and whether the user wrote it."""

    messages: tuple[dict[str, Any], ...]
    anchor: str | None = None
    user: bool = False


class Ollama(Conversation):
    """The Ollama chat adapter (see the module's docstring)."""

    api = OLLAMA_API
    name = "ollama"
    path = "/api/chat"
    framing = Framing.NDJSON
    system_where = "the system message"
    models_path = "/api/tags"

    def validate(self, body: Mapping[str, Any]) -> None:
        """``messages`` (each an object with a string ``role``), ``model``, ``stream``,
        ``options`` (its ``num_predict`` an integer from -2, Ollama's "fill the
        context", to :data:`~sidecar.gate.wire.base.MAX_OUTPUT_LIMIT`).

        :raises MalformedRequest: naming the field.
        """
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "must be a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad(f"messages.{i}.role", "each message needs a string role")
        if "model" in body and not isinstance(body["model"], str):
            raise bad("model", "must be a string")
        if "stream" in body and not isinstance(body["stream"], bool):
            raise bad("stream", "must be a boolean")
        options = body.get("options")
        if options is not None and not isinstance(options, dict):
            raise bad("options", "must be an object")
        if isinstance(options, dict):
            check_int(options.get("num_predict"), "options.num_predict", -2, MAX_OUTPUT_LIMIT)

    def streaming(self, body: Mapping[str, Any]) -> bool:
        """``stream`` unless it is ``false`` (Ollama streams by default)."""
        return body.get("stream") is not False

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The body's ``model``."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def system_texts(self, body: Mapping[str, Any]) -> list[str]:
        """The first ``system`` message's ``content`` (n8n's System Message)."""
        for m in _messages(body):
            if m.get("role") == "system":
                content = m.get("content")
                return [content if isinstance(content, str) else ""]
        return []

    def tool_outputs(self, body: Mapping[str, Any]) -> list[ToolOutput]:
        """The ``role: "tool"`` messages, each answering the next unanswered call
        (the first of its ``tool_name``, when it names one) of the last assistant
        message with calls before it; a tool message with no such call answers
        nothing (nor do the gate's own exchanges)."""
        messages = _seen(_messages(body))
        digest = _digest(messages)
        out: list[ToolOutput] = []
        waiting: list[tuple[int, str]] = []
        n = 0
        for m in messages:
            calls = _calls(m)
            if calls:
                waiting = [(n + k, _name(c)) for k, c in enumerate(calls)]
                n += len(calls)
            elif m.get("role") == "tool" and waiting:
                named = m.get("tool_name")
                at = next(
                    (i for i, (_, tool) in enumerate(waiting) if tool == named),
                    0 if not isinstance(named, str) else None,
                )
                if at is None:
                    continue
                number, _ = waiting.pop(at)
                out.append(ToolOutput(call_id(digest, number), m.get("content")))
        return out

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

    def max_output_tokens(self, body: Mapping[str, Any]) -> int | None:
        """``options.num_predict`` when positive (``-1``: no limit)."""
        options = body.get("options")
        value = options.get("num_predict") if isinstance(options, dict) else None
        return (
            value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
        )

    def spend(self, body: Mapping[str, Any]) -> Spend:
        """One choice; nothing unbounded: images come inline (base64) and the chat
        API holds no context upstream (the ``context`` of ``/api/generate`` is not
        the chat's)."""
        return Spend()

    def with_output_limit(self, body: Mapping[str, Any], limit: int) -> dict[str, Any]:
        """``options.num_predict`` (replacing ``-1``/``-2``, no limit), the other
        options kept."""
        options = body.get("options")
        return {
            **body,
            "options": {**(options if isinstance(options, dict) else {}), "num_predict": limit},
        }

    def number_calls(self, body: Mapping[str, Any], proposals: list[Proposal]) -> list[Proposal]:
        """The proposals numbered after the calls the conversation already holds
        (see the module's docstring); the upstream's ids, if any, are not kept:
        n8n drops them; the gate's own exchanges are not counted)."""
        messages = _seen(_messages(body))
        digest = _digest(messages)
        start = sum(len(_calls(m)) for m in messages)
        return [
            Proposal(call_id(digest, start + k), p.tool, p.args) for k, p in enumerate(proposals)
        ]

    def read_answer(self, answer: Any) -> Answer:
        """``message.tool_calls`` and the counts.

        :raises NotThisAnswer: not an object with a ``message``.
        """
        if not isinstance(answer, dict) or not isinstance(answer.get("message"), dict):
            raise NotThisAnswer("the upstream model answered something that is not an Ollama chat")
        return Answer([_proposal(c) for c in _calls(answer["message"])], self.usage(answer))

    @staticmethod
    def usage(usage: Any) -> Usage:
        """``prompt_eval_count + eval_count`` of an answer or a done line (Ollama
        leaves a zero count out: one missing is 0; both missing is no usage)."""
        if not isinstance(usage, Mapping):
            return Usage()
        counts = [_count(usage.get(k)) for k in ("prompt_eval_count", "eval_count")]
        given = [k in usage for k in ("prompt_eval_count", "eval_count")]
        if not any(given) or any(g and c is None for g, c in zip(given, counts, strict=True)):
            return Usage()
        prompt, evaluated = (c or 0 for c in counts)
        return Usage(prompt + evaluated, (prompt, evaluated))

    def with_wrap_up(self, body: Mapping[str, Any], note: str) -> dict[str, Any]:
        """A last ``system`` message."""
        out = copy.copy(dict(body))
        out["messages"] = [*body["messages"], {"role": "system", "content": note}]
        return out

    def forward_payload(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """The body with ``model`` (Ollama reports a stream's counts on its done line)."""
        payload = dict(body)
        if model:
            payload["model"] = model
        return payload

    def final_answer(self, text: str, model: str, stamp: Stamp) -> dict[str, Any]:
        """One ``done: true`` chat answer holding an assistant message (counts zero)."""
        return {
            "model": model,
            "created_at": _created_at(stamp),
            "message": {"role": "assistant", "content": text},
            "done": True,
            "done_reason": "stop",
            **ZERO_TIMINGS,
        }

    def final_stream(
        self, text: str, model: str, stamp: Stamp, body: Mapping[str, Any]
    ) -> list[bytes]:
        """A line with the text, then the done line (the counts only there)."""
        done = self.final_answer("", model, stamp)
        return [_text_line(done, text, stamp), line(done)]

    def replace_with_text(self, answer: Mapping[str, Any], text: str, stamp: Stamp) -> Any:
        """The answer with its message ``text`` and no calls (``done_reason: stop``)."""
        return {**answer, "message": {"role": "assistant", "content": text}, "done_reason": "stop"}

    def error_body(self, message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
        """Ollama's error object, ``{"error": message}`` (its clients read only that)."""
        return {"error": message}

    def upstream_error_body(self, status: int, answer: Any) -> dict[str, Any]:
        """The upstream's own ``{"error": ...}`` body, else one naming ``status``."""
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            return answer
        return self.error_body(f"the upstream model answered {status}", "upstream_error")

    def error_event(self, message: str, code: str) -> bytes:
        """A line ``{"error": message}`` (the client raises it mid-stream)."""
        return line(self.error_body(message, code))

    def stream_reader(self, body: Mapping[str, Any]) -> OllamaStream:
        """An :class:`OllamaStream`."""
        return OllamaStream()

    def model_list(self, listed: Any, default_model: str) -> dict[str, Any]:
        """``GET /api/tags``: the upstream's list, or one naming ``default_model``."""
        if isinstance(listed, dict) and isinstance(listed.get("models"), list):
            return listed
        return {
            "models": [
                {
                    "name": default_model,
                    "model": default_model,
                    "modified_at": rfc3339(0),
                    "size": 0,
                    "digest": "",
                    "details": {},
                }
            ]
        }

    # -- the gate's own exchanges ------------------------------------------------------

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """``messages`` as :class:`Item` values: a user message anchored by its
        text, a group of calls and outputs by its last call's id (by position, as
        :meth:`number_calls`; the gate's own by its own id)."""
        messages = _messages(body)
        digest = _digest(_seen(messages))
        items: list[Any] = []
        n = 0
        for group in _groups(messages):
            first, calls = group[0], _calls(group[0])
            if calls and _own(first):
                items.append(Item(group, output_anchor(str(calls[-1]["id"]))))
            elif calls:
                n += len(calls)
                items.append(Item(group, output_anchor(call_id(digest, n - 1))))
            elif first.get("role") == "user":
                content = first.get("content")
                text = content if isinstance(content, str) else ""
                items.append(Item(group, user_anchor(text), user=True))
            else:
                items.append(Item(group))
        return items

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The body with ``messages`` made of the items' messages."""
        messages = [m for i in items for m in (i.messages if isinstance(i, Item) else (i,))]
        return {**body, "messages": messages}

    def item_anchor(self, item: Any) -> str | None:
        """The :class:`Item`'s anchor."""
        return item.anchor if isinstance(item, Item) else None

    def is_user_message(self, item: Any) -> bool:
        """A ``role: "user"`` message."""
        return isinstance(item, Item) and item.user

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        """An assistant message with the one call under its own id (``arguments``
        an object, as the API requires), then its ``role: "tool"`` message."""
        args = proposal.args if isinstance(proposal.args, dict) else {}
        call = {
            "id": proposal.call_id,
            "type": "function",
            "function": {"name": proposal.tool, "arguments": args},
        }
        asked = {"role": "assistant", "content": "", "tool_calls": [call]}
        answered = {"role": "tool", "content": output_text, "tool_name": proposal.tool}
        return [Item((asked, answered), output_anchor(proposal.call_id))]
