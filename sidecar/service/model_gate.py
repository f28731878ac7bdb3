"""The model gate (DESIGN §5): an OpenAI-compatible endpoint in front of the
real model, so that every model turn and every tool call of an n8n AI Agent
is admitted and counted, and an ended task ends the agent with a plain final
message.

Both OpenAI APIs n8n uses are served: the Responses API (``/responses``,
the default of n8n 2.x's OpenAI Chat Model node from typeVersion 1.3) and
Chat Completions (``/chat/completions``), streamed (Server-Sent Events) or
not. Per request:

1. find the task: a ``loopstop-task: <task_id>`` line, or a
   ``loopstop-task-key: <key>`` line (with optional ``loopstop-workflow``,
   ``loopstop-policy`` and ``loopstop-execution`` lines) that creates or
   continues the task by key, in ``instructions``, a ``system`` /
   ``developer`` input item or a system message;
2. record every tool output the request carries back
   (``function_call_output``, ``role: "tool"``) as that call's result,
   without evidence;
3. reserve a model turn; when the task has ended, answer a final assistant
   message in the caller's own format and mode without calling the upstream;
4. forward to the upstream's same path (adding a short system message at
   ``wrap_up``), relay its answer (a stream event by event), count the
   tokens it reports (an estimate when a stream is cut before its usage);
5. admit every tool call the upstream proposes through the task guard
   before it reaches n8n; a denied proposal is not relayed: the answer is
   the final message instead.

Prompts and completions are never logged or stored.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import requests
import sseclient

from sidecar.auth import Principal
from sidecar.canonical import canonical_json
from sidecar.config import ModelGateConfig, Settings
from sidecar.core import cost
from sidecar.core.tasks import (
    CallKind,
    CallStatus,
    ResultStatus,
    Task,
    ToolDecision,
    ToolResult,
    TurnDecision,
    TurnReason,
)
from sidecar.errors import (
    GateNotConfigured,
    LoopstopError,
    MalformedRequest,
    NotFound,
    StateConflict,
    ValidationFailed,
)
from sidecar.service.messages import WRAP_UP_MESSAGE, final_message
from sidecar.service.tasks import CallInput, CreateInput, TaskService

TASK_LINE = re.compile(r"loopstop-task:\s*(t[0-9a-f]{20})\b")
_LINE = r"^[ \t]*loopstop-{}:[ \t]*([^\r\n]*?)[ \t]*$"
KEY_LINE = re.compile(_LINE.format("task-key"), re.MULTILINE)
WORKFLOW_LINE = re.compile(_LINE.format("workflow"), re.MULTILINE)
POLICY_LINE = re.compile(_LINE.format("policy"), re.MULTILINE)
EXECUTION_LINE = re.compile(_LINE.format("execution"), re.MULTILINE)
#: How long a ``loopstop-*`` line's value may be (as ``POST /v1/tasks``'s fields).
MAX_LINE_VALUE = 200

#: Characters per token of the estimate used when the upstream reports no
#: usage (a cut stream): the usual 4 characters of English per token.
CHARS_PER_TOKEN = 4


class Api(StrEnum):
    """The OpenAI API a request speaks."""

    CHAT = "chat"
    RESPONSES = "responses"

    @property
    def path(self) -> str:
        return "/chat/completions" if self is Api.CHAT else "/responses"


class UpstreamError(LoopstopError):
    """Raised when the upstream model answered an error, garbage, or could not be reached.

    Rendered OpenAI-style (``{"error": {...}}``) with the same status class,
    which is what n8n's OpenAI node understands.
    """

    status = 502
    slug = "upstream-error"
    title = "Upstream model error"

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body.get("error", {}).get("message", "upstream error")))
        self.status = status
        self.body = body
        #: the turn it ended, for the decision log (None: no turn was admitted)
        self.record: TurnRecord | None = None


# -- reading requests --------------------------------------------------------------


def _text(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def system_texts(api: Api, body: Mapping[str, Any]) -> list[str]:
    """The texts where ``loopstop-*`` lines may stand: ``instructions`` and the
    ``system`` / ``developer`` messages (chat messages or Responses input items)."""
    out: list[str] = []
    if api is Api.RESPONSES:
        if isinstance(body.get("instructions"), str):
            out.append(body["instructions"])
        items = body.get("input")
    else:
        items = body.get("messages")
    if isinstance(items, list):
        for item in items:
            if (
                isinstance(item, dict)
                and item.get("role") in ("system", "developer")
                and item.get("type", "message") == "message"
            ):
                out.append(_text(item.get("content")))
    return out


def task_line(messages: list[Any]) -> str | None:
    """The task id named by a ``loopstop-task:`` line of a system (or developer) message."""
    for text in system_texts(Api.CHAT, {"messages": messages}):
        found = TASK_LINE.search(text)
        if found:
            return found.group(1)
    return None


@dataclass(frozen=True)
class TaskLines:
    """What the ``loopstop-*`` lines of a request name."""

    task_id: str | None = None
    task_key: str | None = None
    workflow: str | None = None
    policy: str | None = None
    execution: str | None = None

    @property
    def named(self) -> bool:
        return self.task_id is not None or self.task_key is not None


def task_lines(texts: Iterable[str]) -> TaskLines:
    """Read the ``loopstop-*`` lines (the first of each kind wins), values in
    Unicode NFC (UAX #15) as the API's names are.

    :raises MalformedRequest: a line's value is empty, too long or holds
        control characters.
    """
    found: dict[str, str] = {}
    for text in texts:
        m = TASK_LINE.search(text)
        if m and "task_id" not in found:
            found["task_id"] = m.group(1)
        for name, pattern in (
            ("task_key", KEY_LINE),
            ("workflow", WORKFLOW_LINE),
            ("policy", POLICY_LINE),
            ("execution", EXECUTION_LINE),
        ):
            m = pattern.search(text)
            if m and name not in found:
                # Names in NFC, as POST /v1/tasks reads them ("Cafe\u0301" is "Caf\u00e9"),
                # checked after: NFC may lengthen a name.
                value = unicodedata.normalize("NFC", m.group(1))
                if not value or len(value) > MAX_LINE_VALUE or not value.isprintable():
                    line = "loopstop-" + name.replace("_", "-")
                    raise MalformedRequest(
                        f"the {line} line needs a value of 1 to {MAX_LINE_VALUE} printable "
                        "characters",
                        errors=[{"loc": ["body", "system", line], "msg": "invalid value"}],
                    )
                found[name] = value
    return TaskLines(**found)


def _bad(field_path: str, msg: str) -> MalformedRequest:
    return MalformedRequest(
        f"{field_path}: {msg}", errors=[{"loc": ["body", *field_path.split(".")], "msg": msg}]
    )


def validate(api: Api, body: Mapping[str, Any]) -> None:
    """Check the body has the API's shape (only what the gate reads).

    :raises MalformedRequest: naming the field that is wrong.
    """
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("stream", "must be a boolean")
    if "model" in body and not isinstance(body["model"], str):
        raise _bad("model", "must be a string")
    if api is Api.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages", "must be a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages.{i}.role", "each message needs a string role")
        if "stream_options" in body and not isinstance(body["stream_options"], dict | None):
            raise _bad("stream_options", "must be an object")
        return
    given = body.get("input")
    if isinstance(given, str):
        if not given and not body.get("instructions"):
            raise _bad("input", "must not be empty")
    elif isinstance(given, list):
        if not given:
            raise _bad("input", "must be a non-empty list of items")
        for i, item in enumerate(given):
            if not isinstance(item, dict):
                raise _bad(f"input.{i}", "each input item must be an object")
    else:
        raise _bad("input", "must be a string or a list of input items")
    if "instructions" in body and not isinstance(body["instructions"], str | None):
        raise _bad("instructions", "must be a string")


@dataclass(frozen=True)
class ToolOutput:
    """A tool's output the agent sends back: the call it answers and its content."""

    call_id: str
    output: Any


def tool_outputs(api: Api, body: Mapping[str, Any]) -> list[ToolOutput]:
    """The tool outputs a request carries (``function_call_output`` items, ``tool`` messages)."""
    out: list[ToolOutput] = []
    if api is Api.RESPONSES:
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if item.get("type") == "function_call_output" and isinstance(item.get("call_id"), str):
                out.append(ToolOutput(item["call_id"], item.get("output")))
    else:
        for m in body.get("messages") or []:
            if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
                out.append(ToolOutput(m["tool_call_id"], m.get("content")))
    return out


@dataclass(frozen=True)
class Proposal:
    """A tool call the upstream proposes: its id, tool name and parsed arguments."""

    call_id: str
    tool: str
    args: Any


def _args(raw: Any) -> Any:
    """A proposed call's arguments as a JSON value the guard can fingerprint.

    The model's argument text is parsed when it is JSON; text that is not
    (NaN, nesting past what can be parsed, a lone surrogate, a value of the
    wrong type) is fingerprinted as the text itself, escaped where it cannot
    be encoded: the same text is the same call, and no model output can fail
    the turn.
    """
    text = raw if isinstance(raw, str) else None
    value: Any = raw
    if text is not None:
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            value = text
    try:
        canonical_json(value)
        return value
    except (ValueError, TypeError, RecursionError):
        fallback = text if text is not None else repr(raw)
        return fallback.encode("utf-8", "backslashreplace").decode("utf-8")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def proposals(api: Api, answer: Mapping[str, Any]) -> list[Proposal]:
    """The tool calls an upstream answer proposes (Responses ``function_call``
    items, chat ``tool_calls``)."""
    out: list[Proposal] = []
    if api is Api.RESPONSES:
        output = answer.get("output")
        for item in output if isinstance(output, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                out.append(
                    Proposal(
                        str(item.get("call_id") or item.get("id") or ""),
                        str(item.get("name") or ""),
                        _args(item.get("arguments")),
                    )
                )
        return out
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
                        _args(fn.get("arguments")),
                    )
                )
    return out


def usage_tokens(api: Api, usage: Any) -> int | None:
    """Tokens a turn used: Responses ``input_tokens + output_tokens``, chat
    ``total_tokens``; None when the usage is missing or malformed."""
    if not isinstance(usage, dict):
        return None
    if api is Api.RESPONSES:
        parts = [usage.get("input_tokens"), usage.get("output_tokens")]
    else:
        parts = [usage.get("total_tokens")]
    if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
        return None
    return sum(int(p) for p in parts if isinstance(p, int))


def estimate_tokens(body: Mapping[str, Any], output_chars: int) -> int:
    """An estimate of a turn's tokens when the upstream reported none: the
    request's JSON and the output seen so far, at :data:`CHARS_PER_TOKEN`
    characters per token; never less than 1 (a turn is never free)."""
    chars = len(json.dumps(body, separators=(",", ":"), default=str)) + output_chars
    return max(1, chars // CHARS_PER_TOKEN)


# -- answers the gate makes itself ---------------------------------------------------


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def final_completion(task: Task, model: str, text: str | None = None) -> dict[str, Any]:
    """A chat completion with one final assistant message (``finish_reason: stop``)."""
    return {
        "id": _id("chatcmpl-loopstop-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text or final_message(task)},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _message_item(text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def final_response(task: Task, model: str, text: str | None = None) -> dict[str, Any]:
    """A Response whose ``output`` is one assistant message (``status: completed``)."""
    text = text or final_message(task)
    return {
        "id": _id("resp_loopstop"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [_message_item(text, _id("msg_loopstop"))],
        "output_text": text,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "metadata": {},
    }


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event (W3C EventSource): ``data`` is JSON-encoded unless a str."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + text.replace("\n", "\ndata: ") + "\n\n").encode()


def _response_message_events(
    text: str, output_index: int, seq: Callable[[], int]
) -> tuple[list[bytes], dict[str, Any]]:
    """The events that add one assistant message to a streamed Response, and the item."""
    item_id = _id("msg_loopstop")
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


def _counter(start: int = 0) -> Callable[[], int]:
    n = [start - 1]

    def nxt() -> int:
        n[0] += 1
        return n[0]

    return nxt


def final_response_stream(task: Task, model: str, text: str | None = None) -> Iterator[bytes]:
    """A refused turn as a valid Responses stream: ``response.created`` ...
    ``response.completed`` with one assistant message."""
    done = final_response(task, model, text)
    seq = _counter()
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    started.pop("output_text", None)
    yield sse(
        {"type": "response.created", "sequence_number": seq(), "response": started},
        "response.created",
    )
    yield sse(
        {"type": "response.in_progress", "sequence_number": seq(), "response": started},
        "response.in_progress",
    )
    events, item = _response_message_events(done["output_text"], 0, seq)
    yield from events
    done["output"] = [item]
    yield sse(
        {"type": "response.completed", "sequence_number": seq(), "response": done},
        "response.completed",
    )


def _chunk(base: Mapping[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": base.get("id") or _id("chatcmpl-loopstop-"),
        "object": "chat.completion.chunk",
        "created": base.get("created") or int(time.time()),
        "model": base.get("model", ""),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def _final_chunks(base: Mapping[str, Any], text: str) -> list[bytes]:
    delta = {"role": "assistant", "content": text}
    return [sse(_chunk(base, delta, None)), sse(_chunk(base, {}, "stop"))]


def _usage_chunk(base: Mapping[str, Any], usage: Any) -> bytes:
    return sse({**_chunk(base, {}, None), "choices": [], "usage": usage})


def final_completion_stream(
    task: Task, model: str, include_usage: bool, text: str | None = None
) -> Iterator[bytes]:
    """A refused turn as a valid chat stream: a content chunk, a chunk with
    ``finish_reason: stop``, the usage chunk when asked for, then ``[DONE]``."""
    base = {"id": _id("chatcmpl-loopstop-"), "created": int(time.time()), "model": model}
    yield from _final_chunks(base, text or final_message(task))
    if include_usage:
        yield _usage_chunk(base, {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
    yield b"data: [DONE]\n\n"


def _error(message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


# -- the gate ----------------------------------------------------------------------------


@dataclass
class TurnRecord:
    """How a turn was decided, for the decision log (filled in as a stream ends).

    :ivar usage: ``reported`` (the upstream said), ``estimated`` (it did not:
        a cut stream), or ``none`` (the upstream was not called).
    :ivar tool_calls: ``(tool, decision, reason)`` per proposed call.
    """

    decision: TurnDecision
    reason: str | None
    task_id: str | None
    api: Api
    stream: bool
    execution: str | None = None
    tokens: int = 0
    usage: str = "none"
    tool_calls: list[tuple[str, str, str | None]] = field(default_factory=list)
    upstream_status: int | None = None
    cost: float | None = None

    def upstream_failed(self, reason: str) -> None:
        """Record that the upstream failed, and how."""
        self.decision, self.reason = TurnDecision.UPSTREAM_ERROR, reason


@dataclass
class GateAnswer:
    """What the gate answers: a JSON body, or a stream of SSE bytes."""

    record: TurnRecord
    body: dict[str, Any] | None = None
    events: Iterator[bytes] | None = None

    @property
    def completion(self) -> dict[str, Any]:
        assert self.body is not None
        return self.body


@dataclass
class _Turn:
    """One request being served."""

    api: Api
    principal: Principal
    body: dict[str, Any]
    model: str
    stream: bool
    record: TurnRecord
    ns: str | None = None
    task_id: str | None = None
    price: cost.Price | None = None
    reserved: float = 0.0


class ModelGate:
    """Admits, forwards and counts model turns and the tool calls they propose.

    :param session: the HTTP session to the upstream (tests inject theirs).
    :param environ: where the upstream's API key is read (``api_key_env``).
    """

    def __init__(
        self,
        config: ModelGateConfig,
        tasks: TaskService,
        session: requests.Session,
        environ: Mapping[str, str],
        settings: Settings | None = None,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.session = session
        self.environ = environ
        self.settings = settings or tasks.settings

    # -- upstream ------------------------------------------------------------------

    def _upstream(self, path: str) -> str:
        if not self.config.upstream_url:
            raise GateNotConfigured("set model_gate.upstream_url to the real model's base URL")
        return self.config.upstream_url.rstrip("/") + path

    def _headers(self) -> dict[str, str]:
        key = self.environ.get(self.config.api_key_env or "", "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _post(self, path: str, payload: dict[str, Any], stream: bool) -> requests.Response:
        """POST to the upstream.

        :raises UpstreamError: unreachable (502), timed out (504), or an error
            status (relayed with its status; its body when it is OpenAI-style).
        """
        try:
            resp = self.session.post(
                self._upstream(path),
                json=payload,
                headers={
                    **self._headers(),
                    **({"Accept": "text/event-stream"} if stream else {}),
                },
                timeout=(min(self.config.timeout_s, 5.0), self.config.timeout_s),
                allow_redirects=False,
                # Always streamed: the body is read under one deadline for the whole
                # exchange (a server dripping bytes or keep-alive comments cannot
                # hold a worker past ``timeout_s``).
                stream=True,
            )
        except requests.Timeout:
            raise UpstreamError(
                504, _error("the upstream model did not answer in time", "timeout")
            ) from None
        except requests.RequestException as exc:
            raise UpstreamError(
                502,
                _error(
                    f"the upstream model is unreachable ({type(exc).__name__})",
                    "upstream_unreachable",
                ),
            ) from None
        if resp.status_code >= 400:
            try:
                answer = json.loads(b"".join(self._stream_source(resp, self._deadline())))
            except Exception:  # unreadable, cut or too slow: the status still says it
                answer = None
            finally:
                resp.close()
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                raise UpstreamError(resp.status_code, answer)
            raise UpstreamError(
                resp.status_code,
                _error(f"the upstream model answered {resp.status_code}", "upstream_error"),
            )
        return resp

    def models(self) -> dict[str, Any]:
        """The upstream's model list (n8n's credential test and model picker), or the
        configured default model when the upstream answers but cannot list.

        :raises GateNotConfigured: no upstream is configured (n8n's credential
            test fails instead of going green on a gate that refuses every turn).
        :raises UpstreamError: the upstream cannot be reached (502): the test
            fails as every turn would.
        """
        url = self._upstream("/models")
        try:
            resp = self.session.get(
                url,
                headers=self._headers(),
                timeout=(3.0, min(self.config.timeout_s, 10.0)),
                allow_redirects=False,
            )
        except requests.RequestException:
            raise UpstreamError(
                502, _error("the upstream model cannot be reached", "upstream_unreachable")
            ) from None
        try:
            listed = resp.json() if resp.status_code == 200 else None
            if isinstance(listed, dict) and isinstance(listed.get("data"), list):
                return listed
        except ValueError:
            pass
        model = self.config.default_model or "loopstop-gate"
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "loopstop"}],
        }

    # -- the task --------------------------------------------------------------------

    def _find_task(self, turn: _Turn, lines: TaskLines) -> Task | None:
        """The task the lines name (created by key when new), or None when untracked.

        :raises MalformedRequest: no task named and untracked requests are not allowed.
        :raises NotFound: the ``loopstop-task`` line names no task.
        """
        if lines.task_id is not None:
            ns = self.tasks.namespace_of(lines.task_id)
            if ns is None:
                raise NotFound(f"no task {lines.task_id!r}")
            turn.ns, turn.task_id = ns, lines.task_id
            return None  # read only when needed (tool outputs to record)
        if lines.task_key is not None:
            ns = "p"
            task = self._by_key(turn.principal, ns, lines)
            turn.ns, turn.task_id = ns, task.task_id
            return task
        if not self.config.allow_untracked:
            where = (
                "instructions or a system message"
                if turn.api is Api.RESPONSES
                else ("the system message")
            )
            raise MalformedRequest(
                f"no 'loopstop-task: <task_id>' or 'loopstop-task-key: <key>' line in {where}: "
                "add one to the AI Agent's System Message (or set model_gate.allow_untracked)",
                errors=[{"loc": ["body", "system", "loopstop-task"], "msg": "missing"}],
            )
        return None

    def _by_key(self, principal: Principal, ns: str, lines: TaskLines) -> Task:
        """Continue the task made under the key, or create it as ``POST /v1/tasks`` does.

        A task found by key is continued in its current run: every model turn
        of one agent run names the same key, and starting a new run on each
        would forget its identical calls.
        """
        assert lines.task_key is not None
        found = self.tasks.by_key(principal, ns, lines.workflow, lines.task_key)
        if found is not None:
            return found
        task, _ = self.tasks.create(
            principal,
            ns,
            CreateInput(
                task_key=lines.task_key,
                workflow=lines.workflow,
                chain_id=None,
                policy=lines.policy,
                limits={},
            ),
        )
        return task

    def _record_outputs(self, turn: _Turn, task: Task | None) -> None:
        """Record the tool outputs the request carries for calls still pending.

        The agent sends its whole history each turn: outputs already recorded
        (or answering calls the gate never admitted) are skipped.
        """
        outputs = tool_outputs(turn.api, turn.body)
        if not outputs or turn.ns is None or turn.task_id is None:
            return
        if task is None:
            task = self.tasks.get(turn.principal, turn.ns, turn.task_id)
        pending = {c.call_id for c in task.history() if c.status is CallStatus.PENDING}
        fp = self.tasks.fp
        for out in outputs:
            if out.call_id not in pending:
                continue
            pending.discard(out.call_id)
            result = ToolResult(status=ResultStatus.OK, result_fp=fp.fingerprint(out.output))
            try:
                self.tasks.tool_result(turn.principal, turn.ns, turn.task_id, out.call_id, result)
            except (NotFound, StateConflict):
                continue  # recorded meanwhile by another request: nothing to add

    def _kind(self, tool: str) -> CallKind:
        configured = self.settings.tools.get(tool)
        return CallKind(configured.kind) if configured is not None else CallKind.READ

    def _admit_calls(self, turn: _Turn, calls: list[Proposal]) -> tuple[Task, str] | None:
        """Admit each proposed call in order; at the first denial, the task and
        the final text to answer instead (None: every call may reach n8n).

        A tool configured ``kind: write`` is not admitted here: a write needs an
        operation id, which only the flow can give (a Loop Stop node's Admit
        Tool Call in the tool's sub-workflow); the gate relays it to the flow.
        """
        if turn.ns is None or turn.task_id is None:
            return None
        for call in calls:
            kind = self._kind(call.tool)
            if kind is CallKind.WRITE:
                turn.record.tool_calls.append((call.tool, "left_to_flow", "write"))
                continue
            task, out = self.tasks.tool_call(
                turn.principal,
                turn.ns,
                turn.task_id,
                CallInput(
                    tool=call.tool,
                    kind=kind,
                    args=call.args,
                    operation_id=None,
                    call_id=call.call_id or None,
                ),
            )
            reason = None if out.reason is None else str(out.reason)
            turn.record.tool_calls.append((call.tool, str(out.decision), reason))
            if out.decision is ToolDecision.DENY:
                turn.record.decision, turn.record.reason = TurnDecision.DENY_TOOL_CALL, reason
                if task.envelope is not None:
                    return task, final_message(task)
                return task, (
                    f"[loopstop] The call to {call.tool} was not admitted ({reason}). Do not "
                    "repeat it now; continue with what you have."
                )
        return None

    # -- serving a turn --------------------------------------------------------------

    def chat(self, principal: Principal, body: dict[str, Any]) -> GateAnswer:
        """Serve one ``POST /chat/completions`` (see :meth:`turn`)."""
        return self.turn(Api.CHAT, principal, body)

    def responses(self, principal: Principal, body: dict[str, Any]) -> GateAnswer:
        """Serve one ``POST /responses`` (see :meth:`turn`)."""
        return self.turn(Api.RESPONSES, principal, body)

    def turn(self, api: Api, principal: Principal, body: dict[str, Any]) -> GateAnswer:
        """Serve one model request of either API, streamed or not.

        :raises MalformedRequest: the body is not the API's shape, or names no
            task (unless untracked requests are allowed).
        :raises NotFound: the task line names no task.
        :raises GateNotConfigured: no upstream is configured (nothing is admitted).
        :raises UpstreamError: the upstream failed before answering; relayed
            OpenAI-style (a failure mid-stream is an error event instead).
        """
        validate(api, body)
        self._upstream("")  # a misconfigured gate admits nothing
        stream = bool(body.get("stream"))
        model = str(body.get("model") or self.config.default_model or "")
        lines = task_lines(system_texts(api, body))
        record = TurnRecord(TurnDecision.UNTRACKED, None, None, api, stream, lines.execution)
        turn = _Turn(api, principal, body, model, stream, record)
        task = self._find_task(turn, lines)
        record.task_id = turn.task_id
        if turn.task_id is None or turn.ns is None:
            return self._forward(turn, body)
        self._record_outputs(turn, task)
        reserve = self._reservation(turn, task)
        task, outcome = self.tasks.model_call(
            principal,
            turn.ns,
            turn.task_id,
            None,
            reserve_cost=reserve,
            execution_id=lines.execution,
        )
        turn.reserved = (reserve or 0.0) if outcome.admitted else 0.0
        if not outcome.admitted:
            record.decision = TurnDecision.DENY
            record.reason = None if outcome.reason is None else str(outcome.reason)
            return self._refusal(turn, task, None)
        record.decision = TurnDecision.ADMIT
        record.reason = TurnReason.WRAP_UP if outcome.wrap_up else None
        forward = body
        if outcome.wrap_up:
            forward = copy.copy(body)
            note = {"role": "system", "content": WRAP_UP_MESSAGE}
            if api is Api.CHAT:
                forward["messages"] = [*body["messages"], note]
            elif isinstance(body.get("input"), list):
                forward["input"] = [*body["input"], {"type": "message", **note}]
            else:
                forward["input"] = [
                    {"type": "message", "role": "user", "content": body["input"]},
                    {"type": "message", **note},
                ]
        return self._forward(turn, forward)

    def _refusal(self, turn: _Turn, task: Task, text: str | None) -> GateAnswer:
        """A final message in the caller's format and mode (the upstream is not called)."""
        include_usage = bool((turn.body.get("stream_options") or {}).get("include_usage"))
        if turn.api is Api.CHAT:
            if turn.stream:
                return GateAnswer(
                    turn.record,
                    events=final_completion_stream(task, turn.model, include_usage, text),
                )
            return GateAnswer(turn.record, body=final_completion(task, turn.model, text))
        if turn.stream:
            return GateAnswer(turn.record, events=final_response_stream(task, turn.model, text))
        return GateAnswer(turn.record, body=final_response(task, turn.model, text))

    def _reservation(self, turn: _Turn, task: Task | None) -> float | None:
        """The turn's worst-case cost at its model's price (None: the model has no price).

        :raises ValidationFailed: the model has no price and the task has a
            money budget (a turn nobody can price is never a free pass).
        """
        found = self.config.prices.get(turn.model)
        if found is None:
            if task is None and turn.ns is not None and turn.task_id is not None:
                task = self.tasks.get(turn.principal, turn.ns, turn.task_id)
            if task is not None and task.envelope is None and task.limits.max_cost is not None:
                raise ValidationFailed(
                    [
                        {
                            "loc": ["body", "model"],
                            "msg": f"model {turn.model!r} has no price in model_gate.prices, "
                            "and the task has a money budget (max_cost)",
                        }
                    ]
                )
            return None
        turn.price = cost.Price(found.input_per_mtok, found.output_per_mtok)
        limit = cost.max_output_tokens(turn.body, self.config.max_output_tokens)
        return cost.worst_case(turn.price, estimate_tokens(turn.body, 0), limit)

    def _count(self, turn: _Turn, usage: Any, estimate: int, *, answered: bool = True) -> None:
        """Count a turn once it is over: its tokens (the reported usage, else
        ``estimate``) and, for a priced model, settle its reservation with
        what it cost (:func:`sidecar.core.cost.settled_cost`)."""
        reported = usage_tokens(turn.api, usage)
        tokens = estimate if reported is None else reported
        turn.record.tokens = tokens
        turn.record.usage = "estimated" if reported is None else "reported"
        if turn.ns is None or turn.task_id is None:
            return
        if turn.price is None:
            if tokens:
                self.tasks.record_tokens(turn.principal, turn.ns, turn.task_id, tokens)
            return
        spent = cost.settled_cost(turn.price, turn.reserved, usage, answered=answered)
        turn.record.cost = spent
        self.tasks.settle_model_call(
            turn.principal, turn.ns, turn.task_id, turn.reserved, spent, tokens
        )

    def _payload(self, turn: _Turn, body: dict[str, Any]) -> dict[str, Any]:
        payload = dict(body)
        if turn.model:
            payload["model"] = turn.model
        if turn.stream and turn.api is Api.CHAT:
            payload["stream_options"] = {
                **(body.get("stream_options") or {}),
                "include_usage": True,
            }
        return payload

    def _forward(self, turn: _Turn, body: dict[str, Any]) -> GateAnswer:
        payload = self._payload(turn, body)
        try:
            resp = self._post(turn.api.path, payload, turn.stream)
        except UpstreamError as exc:
            turn.record.upstream_status = exc.status
            turn.record.upstream_failed(str(exc.status))
            exc.record = turn.record
            # The turn was admitted: the request counts, whatever the upstream did.
            self._count(turn, None, estimate_tokens(payload, 0), answered=False)
            raise
        turn.record.upstream_status = resp.status_code
        if turn.stream:
            ctype = resp.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                resp.close()
                self._count(turn, None, estimate_tokens(payload, 0))
                raise self._bad_upstream(
                    turn, "the upstream model answered a stream request without a stream"
                )
            relay = _ResponsesRelay if turn.api is Api.RESPONSES else _ChatRelay
            return GateAnswer(turn.record, events=relay(self, turn, payload, resp).run())
        content = self._read_body(turn, payload, resp)
        try:
            answer = json.loads(content)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or (
            "output" not in answer if turn.api is Api.RESPONSES else "choices" not in answer
        ):
            self._count(turn, None, estimate_tokens(payload, len(content)))
            shape = "a Response" if turn.api is Api.RESPONSES else "a chat completion"
            raise self._bad_upstream(
                turn, f"the upstream model answered something that is not {shape}"
            )
        self._count(turn, answer.get("usage"), estimate_tokens(payload, len(content)))
        denied = self._admit_calls(turn, proposals(turn.api, answer))
        if denied is None:
            return GateAnswer(turn.record, body=answer)
        _, text = denied
        return GateAnswer(turn.record, body=_replace_with_text(turn.api, answer, text))

    @staticmethod
    def _bad_upstream(turn: _Turn, message: str) -> UpstreamError:
        turn.record.upstream_failed(TurnReason.BAD_UPSTREAM_RESPONSE)
        exc = UpstreamError(502, _error(message, "bad_upstream_response"))
        exc.record = turn.record
        return exc

    def _deadline(self) -> float:
        """When an upstream exchange that starts now must be over (monotonic seconds)."""
        return time.monotonic() + self.config.timeout_s

    def _stream_source(self, resp: requests.Response, deadline: float) -> Iterator[bytes]:
        """The body's bytes as they arrive (one socket read each, never waiting
        for a block to fill), until the upstream ends it.

        :raises _Cut: ``deadline`` passed (comments and trickled bytes included).
        """
        raw = resp.raw
        while True:
            if time.monotonic() > deadline:
                raise _Cut("the upstream model took too long", "timeout")
            data = raw.read1(65536, decode_content=True)
            if not data:
                return
            yield data

    def _read_body(self, turn: _Turn, payload: dict[str, Any], resp: requests.Response) -> bytes:
        """A non-streamed answer's whole body, read under the exchange's deadline.

        :raises UpstreamError: too slow (504) or cut (502); the turn is counted.
        """
        chunks: list[bytes] = []
        try:
            for data in self._stream_source(resp, self._deadline()):
                chunks.append(data)
        except _Cut:
            self._count(turn, None, estimate_tokens(payload, sum(map(len, chunks))))
            turn.record.upstream_failed(TurnReason.TIMEOUT)
            exc = UpstreamError(504, _error("the upstream model did not answer in time", "timeout"))
            exc.record = turn.record
            raise exc from None
        except Exception:  # requests' and urllib3's read and protocol errors
            self._count(turn, None, estimate_tokens(payload, sum(map(len, chunks))))
            turn.record.upstream_failed(TurnReason.UPSTREAM_STREAM_CUT)
            exc = UpstreamError(
                502, _error("the upstream model's answer broke off", "upstream_stream_cut")
            )
            exc.record = turn.record
            raise exc from None
        finally:
            resp.close()
        return b"".join(chunks)


def _replace_with_text(api: Api, answer: dict[str, Any], text: str) -> dict[str, Any]:
    """The upstream's answer with its proposal replaced by one final message."""
    out = dict(answer)
    if api is Api.RESPONSES:
        out["output"] = [_message_item(text, _id("msg_loopstop"))]
        out["output_text"] = text
        out["status"] = "completed"
        return out
    out["choices"] = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    return out


class _Cut(Exception):
    """The upstream stream ended early or sent something unreadable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class _Relay:
    """Relays one upstream stream to the agent, event by event.

    Text events are passed on as they arrive; the events of a proposed tool
    call are held until the proposal is complete and decided. Usage is read
    from the stream's final event; a stream that ends before it is counted
    by an estimate, and the agent gets an error event it understands.
    """

    def __init__(
        self, gate: ModelGate, turn: _Turn, payload: dict[str, Any], resp: requests.Response
    ) -> None:
        self.gate = gate
        self.turn = turn
        self.payload = payload
        self.resp = resp
        self.deadline = time.monotonic() + gate.config.timeout_s
        self.output_chars = 0
        self.counted = False

    def events(self) -> Iterator[sseclient.Event]:
        client = sseclient.SSEClient(self.gate._stream_source(self.resp, self.deadline))
        try:
            for event in client.events():
                if time.monotonic() > self.deadline:
                    raise _Cut("the upstream model's stream took too long", "timeout")
                yield event
        except requests.RequestException as exc:
            raise _Cut(
                f"the upstream model's stream broke ({type(exc).__name__})", "upstream_stream_cut"
            ) from None
        except Exception as exc:  # urllib3's protocol and read errors, socket timeouts
            if isinstance(exc, _Cut):
                raise
            raise _Cut(
                f"the upstream model's stream broke ({type(exc).__name__})", "upstream_stream_cut"
            ) from None

    def count(self, usage: Any) -> None:
        """Count the turn once: ``usage`` as the stream reported it (None: it did not)."""
        if self.counted:
            return
        self.counted = True
        self.gate._count(self.turn, usage, estimate_tokens(self.payload, self.output_chars))

    def error_event(self, cut: _Cut) -> bytes:
        """An error the OpenAI client raises mid-stream (an event with an ``error`` member)."""
        self.turn.record.decision = TurnDecision.UPSTREAM_ERROR
        self.turn.record.reason = cut.code
        body = _error(str(cut), cut.code, "upstream_error")
        return sse({"type": "error", **body, "message": str(cut), "code": cut.code}, "error")

    def run(self) -> Iterator[bytes]:
        try:
            yield from self.relay()
        except _Cut as cut:
            self.count(None)
            yield self.error_event(cut)
        finally:
            self.resp.close()
            self.count(None)  # the agent went away mid-stream: never free

    def relay(self) -> Iterator[bytes]:
        raise NotImplementedError

    @staticmethod
    def _json(event: sseclient.Event) -> dict[str, Any]:
        try:
            data = json.loads(event.data)
        except ValueError:
            raise _Cut(
                "the upstream model sent an unreadable event", "bad_upstream_response"
            ) from None
        if not isinstance(data, dict):
            raise _Cut("the upstream model sent an unreadable event", "bad_upstream_response")
        return data

    @staticmethod
    def _raw(event: sseclient.Event) -> bytes:
        return sse(event.data, None if event.event == "message" else event.event)


_CALL_EVENTS = ("response.function_call_arguments.delta", "response.function_call_arguments.done")


class _ResponsesRelay(_Relay):
    def relay(self) -> Iterator[bytes]:
        held: list[bytes] = []
        calls: set[Any] = set()
        last_seq = 0
        for event in self.events():
            data = self._json(event)
            kind = str(data.get("type") or event.event)
            if isinstance(data.get("sequence_number"), int):
                last_seq = data["sequence_number"]
            if kind == "error":
                self.count(None)
                self.turn.record.upstream_failed(TurnReason.ERROR_EVENT)
                yield self._raw(event)
                return
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                response = data.get("response")
                if not isinstance(response, dict):
                    raise _Cut(
                        "the upstream model sent an unreadable final event",
                        "bad_upstream_response",
                    )
                self.count(response.get("usage"))
                yield from self._finish(event, data, response, held, last_seq)
                return
            item = data.get("item")
            if (
                kind.startswith("response.output_item.")
                and isinstance(item, dict)
                and item.get("type") == "function_call"
            ):
                calls.add(data.get("output_index"))
                held.append(self._raw(event))
                continue
            if kind in _CALL_EVENTS and data.get("output_index") in calls:
                held.append(self._raw(event))
                continue
            if kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
                self.output_chars += len(data["delta"])
            yield self._raw(event)
        raise _Cut(
            "the upstream model's stream ended before response.completed", "upstream_stream_cut"
        )

    def _finish(
        self,
        event: sseclient.Event,
        data: dict[str, Any],
        response: dict[str, Any],
        held: list[bytes],
        last_seq: int,
    ) -> Iterator[bytes]:
        denied = self.gate._admit_calls(self.turn, proposals(Api.RESPONSES, response))
        if denied is None:
            yield from held
            yield self._raw(event)
            return
        kept = [
            i
            for i in response.get("output") or []
            if not (isinstance(i, dict) and i.get("type") == "function_call")
        ]
        seq = _counter(last_seq + 1)
        events, item = _response_message_events(denied[1], len(kept), seq)
        yield from events
        done = {**response, "output": [*kept, item], "status": "completed"}
        yield sse(
            {**data, "type": "response.completed", "sequence_number": seq(), "response": done},
            "response.completed",
        )


class _ChatRelay(_Relay):
    def relay(self) -> Iterator[bytes]:
        asked = bool((self.turn.body.get("stream_options") or {}).get("include_usage"))
        held: list[bytes] = []
        parts: dict[int, dict[str, Any]] = {}
        usage: Any = None
        base: dict[str, Any] = {}
        finished = False
        for event in self.events():
            if event.data.strip() == "[DONE]":
                break
            chunk = self._json(event)
            if "error" in chunk:
                self.count(None)
                self.turn.record.upstream_failed(TurnReason.ERROR_EVENT)
                yield self._raw(event)
                return
            base = base or chunk
            choices = chunk.get("choices")
            choices = choices if isinstance(choices, list) else []
            raw = self._raw(event)
            if chunk.get("usage") is not None:
                usage = chunk["usage"]
                if not choices:
                    continue  # sent at the end, when the client asked for it
                raw = sse({k: v for k, v in chunk.items() if k != "usage"})
            proposing = False
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta")
                delta = delta if isinstance(delta, dict) else {}
                if choice.get("finish_reason"):
                    finished = True
                if choice.get("finish_reason") == "tool_calls":
                    proposing = True
                calls = delta.get("tool_calls")
                for call in calls if isinstance(calls, list) else []:
                    if not isinstance(call, dict):
                        continue
                    proposing = True
                    index = call.get("index")
                    part = parts.setdefault(index if isinstance(index, int) else 0, {"args": ""})
                    if call.get("id"):
                        part["id"] = call["id"]
                    fn = call.get("function")
                    fn = fn if isinstance(fn, dict) else {}
                    if fn.get("name"):
                        part["name"] = fn["name"]
                    if isinstance(fn.get("arguments"), str):
                        part["args"] += fn["arguments"]
                if isinstance(delta.get("content"), str):
                    self.output_chars += len(delta["content"])
            if proposing:
                held.append(raw)
                continue
            yield raw
        if not finished:
            raise _Cut(
                "the upstream model's stream ended before its last chunk", "upstream_stream_cut"
            )
        self.count(usage)
        calls = [
            Proposal(str(p.get("id") or ""), str(p.get("name") or ""), _args(p["args"]))
            for _, p in sorted(parts.items())
        ]
        denied = self.gate._admit_calls(self.turn, calls)
        if denied is None:
            yield from held
        else:
            yield from _final_chunks(base, denied[1])
        if asked and usage is not None:
            yield _usage_chunk(base, usage)
        yield b"data: [DONE]\n\n"
