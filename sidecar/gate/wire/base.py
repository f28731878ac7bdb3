"""What every wire-format adapter of the model gate speaks (DESIGN §5, STYLE 18).

An adapter is pure: it reads a request's parts, an upstream's answer and
its stream, and renders the gate's own answers, with no socket, no clock
and no randomness. What must be new per answer (ids, the creation time)
comes in as a :class:`Stamp` the service makes from its injected clock.

A stream is split into :class:`Frame` values by the outbound layer (the
:class:`Framing` says how: Server-Sent Events now, NDJSON for Ollama); an
adapter's :class:`StreamReader` turns frames into :class:`StreamEvent`
values: text passed on as it arrives, tool-call fragments held until the
proposal is decided, the turn's final proposals and usage, or the
upstream's own error event.

Each adapter names its :class:`Api` (``api``): which
``model_gate.upstreams`` entry it is forwarded to, the header the real key
goes in, the request headers passed on unchanged, and where the agent's
loopstop token is read from; the service reads these and never the format.

An API that gives calls no id (Ollama, Gemini) has its adapter number the
proposals by their position in the conversation (``number_calls``), and
read the tool outputs coming back by the same numbers (``tool_outputs``).

Writes at the gate (DESIGN §5.1) put exchanges of the gate's own into the
conversation: a proposal it did not relay and the tool output it wrote
itself. An adapter gives the primitives (:meth:`WireAdapter.conversation`,
:meth:`~WireAdapter.with_conversation`, :meth:`~WireAdapter.item_anchor`,
:meth:`~WireAdapter.is_user_message`, :meth:`~WireAdapter.exchange_items`);
:class:`Conversation` builds ``with_exchange`` and ``with_kept`` on them
with the one splice rule of :func:`sidecar.core.gate_writes.splice`. A
stream the gate asks again within one request is read by
:meth:`StreamReader.follow_on`, which continues the answer the agent is
reading.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from sidecar.canonical import canonical_json
from sidecar.core.gate_writes import KeptExchange
from sidecar.errors import MalformedRequest

#: Characters per token of the estimate used when the upstream reports no
#: usage (a cut stream): the usual 4 characters of English per token.
CHARS_PER_TOKEN = 4
#: The most tokens one turn can report: past every model's context; a bigger
#: count (10^308, 10^400) is not a count, read as no usage (never free).
MAX_TURN_TOKENS = 100_000_000
#: The largest output limit (``max_tokens`` ...) and choice count (``n``) a
#: request may set: what no API accepts is refused at parse, naming the field.
MAX_OUTPUT_LIMIT = 10_000_000
MAX_CHOICES = 128


class Framing(StrEnum):
    """How an upstream stream is split into frames."""

    SSE = "sse"  # W3C Server-Sent Events (OpenAI, Anthropic, Gemini ``alt=sse``)
    NDJSON = "ndjson"  # one JSON document per line (Ollama)

    @property
    def content_type(self) -> str:
        """The media type an upstream answering a stream request must send."""
        return "text/event-stream" if self is Framing.SSE else "application/x-ndjson"


@dataclass(frozen=True)
class TokenFrom:
    """Where a client of an API puts its key (the gate reads a loopstop token there).

    :ivar header: a header name (``x-api-key``), ``""`` when it is a query parameter.
    :ivar bearer: the header's value is ``Bearer <token>`` (RFC 6750).
    :ivar query: a query parameter's name (Gemini's ``key``), ``""`` when a header.
    """

    header: str = ""
    bearer: bool = False
    query: str = ""

    def describe(self) -> str:
        """How a client sends it, for the 401's text (``x-api-key: <token>``)."""
        if self.query:
            return f"the {self.query} query parameter"
        return f"{self.header}: Bearer <token>" if self.bearer else f"{self.header}: <token>"


#: ``Authorization: Bearer <token>`` (OpenAI's clients; every other loopstop route).
BEARER = TokenFrom("Authorization", bearer=True)


@dataclass(frozen=True)
class Api:
    """How one API is reached and authenticated (DESIGN §5, the node table).

    :ivar name: its entry under ``model_gate.upstreams`` and its route prefix
        (``/v1/<name>``).
    :ivar key_header: the header the upstream's real key is sent in.
    :ivar key_prefix: what stands before the key in it (``"Bearer "``).
    :ivar pass_headers: request headers forwarded unchanged (version headers;
        names in lower case).
    :ivar default_headers: sent when the request did not send them.
    :ivar token_from: where the agent's loopstop token is read, in order.
    :ivar drop_query: query parameters never forwarded (a key in the query).
    """

    name: str
    key_header: str
    key_prefix: str = ""
    pass_headers: tuple[str, ...] = ()
    default_headers: tuple[tuple[str, str], ...] = ()
    token_from: tuple[TokenFrom, ...] = (BEARER,)
    drop_query: tuple[str, ...] = ()


#: OpenAI's API: the key as a bearer token.
OPENAI = Api("openai", "Authorization", "Bearer ")


@dataclass(frozen=True)
class Inbound:
    """What of the agent's request is forwarded besides its body: the path below
    the API's prefix, the query string (raw), and its headers, their names in
    lower case (only the API's ``pass_headers`` are read from them); ``raw``, the
    body's bytes as they came (None: not kept), sent as they are when the gate
    forwards the request unchanged (no second serialisation)."""

    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    raw: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Frame:
    """One frame of an upstream stream: an SSE event's data and name (None for
    the default ``message``), or one NDJSON line (``event`` None)."""

    data: str
    event: str | None = None


@dataclass(frozen=True)
class Stamp:
    """What is new in an answer the gate writes: ``created`` (Unix seconds) and
    ``token`` (a hex string unique to the answer, the tail of its ids)."""

    created: int
    token: str

    def id(self, prefix: str) -> str:
        """An id of the answer: ``prefix`` and the token."""
        return prefix + self.token


@dataclass(frozen=True)
class ToolOutput:
    """A tool's output the agent sends back: the call it answers and its content."""

    call_id: str
    output: Any


@dataclass(frozen=True)
class Proposal:
    """A tool call the upstream proposes: its id (``""`` when it gave none), tool
    name and parsed arguments (:func:`parse_args`)."""

    call_id: str
    tool: str
    args: Any


@dataclass(frozen=True)
class Usage:
    """What an upstream reported a turn used: ``tokens`` as the API counts a
    turn, and ``split``, ``(input, output)`` tokens for its price; each None
    when not reported (or malformed)."""

    tokens: int | None = None
    split: tuple[int, int] | None = None


NO_USAGE = Usage()


@dataclass(frozen=True)
class Spend:
    """What bounds a request's cost besides its bytes and output limit (DESIGN §3
    ``max_cost``): ``choices`` answers it asks for (each up to the output
    limit), and ``unbounded``, the dotted path of a field whose cost the
    request's own bytes do not bound (context held upstream, media by URL or
    id, a hosted tool), None when there is none."""

    choices: int = 1
    unbounded: str | None = None


@dataclass(frozen=True)
class Answer:
    """A non-streamed upstream answer, read: the calls it proposes and its usage."""

    proposals: list[Proposal]
    usage: Usage


class NotThisAnswer(Exception):
    """Raised by :meth:`WireAdapter.read_answer` when the upstream answered
    something that is not this API's answer; the message says what it is not."""


class StreamBroken(Exception):
    """Raised when an upstream stream is cut, too slow or unreadable.

    :ivar code: the error code the agent sees (``timeout``,
        ``upstream_stream_cut``, ``bad_upstream_response``), also the turn's
        reason in the decision log.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Passed:
    """A stream event relayed as it arrives; ``chars`` of model text it carries."""

    raw: bytes
    chars: int = 0


@dataclass(frozen=True)
class Held:
    """A stream event of a tool-call proposal, held until the proposal is decided."""

    raw: bytes
    chars: int = 0


@dataclass(frozen=True)
class Final:
    """The end of the turn's stream: the calls it proposes and its usage."""

    proposals: list[Proposal]
    usage: Usage


@dataclass(frozen=True)
class ErrorEvent:
    """The upstream's own error event, relayed as is; the stream ends with it."""

    raw: bytes


StreamEvent = Passed | Held | Final | ErrorEvent


class StreamReader(Protocol):
    """Reads one upstream stream (one per turn; it keeps what it needs to finish)."""

    def feed(self, frame: Frame) -> list[StreamEvent]:
        """The events one frame makes; after a :class:`Final` or an
        :class:`ErrorEvent` nothing more is fed.

        :raises StreamBroken: the frame is unreadable.
        """
        ...

    def end(self) -> Final:
        """The upstream ended the stream without a final event of its own.

        :raises StreamBroken: the stream ended before the turn was complete.
        """
        ...

    def finish(self, held: Sequence[Held], text: str | None, stamp: Stamp) -> list[bytes]:
        """What to emit after the :class:`Final`: the held events as they came
        (``text`` None: every proposal was admitted), or ``text`` as the final
        message in place of the proposals; then the API's closing events."""
        ...

    def follow_on(self, body: Mapping[str, Any]) -> StreamReader:
        """A reader for the next upstream stream of the same request (the gate
        asked again, ``body`` the request it sent): its events continue the
        answer the agent is reading (no second start of a response, indexes and
        sequence numbers after this stream's); this stream's held events and
        closing events are never emitted."""
        ...


class WireAdapter(Protocol):
    """One wire format the gate speaks (every method pure).

    :ivar name: the API's name in the decision log (``chat``, ``responses``).
    :ivar api: the API it belongs to (its upstream, key header and token headers).
    :ivar path: the path of its turns, below the API's prefix (forwarded as is).
    :ivar framing: how its streams are framed.
    :ivar system_where: where its System Message stands (for the 400 naming no task).
    :ivar models_path: the upstream path listing models.
    """

    name: str
    api: Api
    path: str
    framing: Framing
    system_where: str
    models_path: str

    def validate(self, body: Mapping[str, Any]) -> None:
        """Check the body has the API's shape (only what the gate reads).

        :raises MalformedRequest: naming the field that is wrong.
        """
        ...

    def streaming(self, body: Mapping[str, Any]) -> bool:
        """Whether the request asks for a stream."""
        ...

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The model the request names (in its body or its path, ``route``)."""
        ...

    def system_texts(self, body: Mapping[str, Any]) -> list[str]:
        """The agent's System Message: the texts where the ``loopstop-*`` lines stand."""
        ...

    def tool_outputs(self, body: Mapping[str, Any]) -> list[ToolOutput]:
        """The tool outputs the request carries back."""
        ...

    def offered_tools(self, body: Mapping[str, Any]) -> frozenset[str] | None:
        """The names of the tools the request offers (None: it offers no tool list)."""
        ...

    def max_output_tokens(self, body: Mapping[str, Any]) -> int | None:
        """The most output the request allows (None: it sets no limit)."""
        ...

    def number_calls(self, body: Mapping[str, Any], proposals: list[Proposal]) -> list[Proposal]:
        """The proposals an answer to ``body`` makes, with the ids the gate tracks
        them by: the upstream's own, or (an API without call ids) ids by position
        that the tool outputs of later requests name again."""
        ...

    def spend(self, body: Mapping[str, Any]) -> Spend:
        """What else bounds the request's cost (:class:`Spend`)."""
        ...

    def with_output_limit(self, body: Mapping[str, Any], limit: int) -> dict[str, Any]:
        """The request with ``limit`` as its output limit (it set none)."""
        ...

    def read_answer(self, answer: Any) -> Answer:
        """Read a non-streamed answer (its parsed JSON; None when it was not JSON).

        :raises NotThisAnswer: it is not this API's answer.
        """
        ...

    def usage(self, usage: Any) -> Usage:
        """A usage object as the API reports it, read."""
        ...

    def with_wrap_up(self, body: Mapping[str, Any], note: str) -> dict[str, Any]:
        """The request with ``note`` added as a last system message."""
        ...

    def forward_payload(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """What is sent upstream: the request with its model (when one is known)
        and whatever the gate needs the upstream to report (a stream's usage)."""
        ...

    def final_answer(self, text: str, model: str, stamp: Stamp) -> dict[str, Any]:
        """The gate's own answer: one final assistant message."""
        ...

    def final_stream(
        self, text: str, model: str, stamp: Stamp, body: Mapping[str, Any]
    ) -> list[bytes]:
        """The gate's own answer as a complete stream in the API's framing."""
        ...

    def replace_with_text(self, answer: Mapping[str, Any], text: str, stamp: Stamp) -> Any:
        """The upstream's answer with its proposals replaced by one final message."""
        ...

    def error_body(self, message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
        """An error in the API's own shape."""
        ...

    def upstream_error_body(self, status: int, answer: Any) -> dict[str, Any]:
        """The body relaying an upstream error status: its own body when it is in
        the API's error shape, else one of the gate's naming the status."""
        ...

    def error_event(self, message: str, code: str) -> bytes:
        """An error event that ends a stream which had begun (the API's client raises it)."""
        ...

    def stream_reader(self, body: Mapping[str, Any]) -> StreamReader:
        """A reader for the stream answering ``body``."""
        ...

    def model_list(self, listed: Any, default_model: str) -> dict[str, Any]:
        """The model list to answer: the upstream's when it is one, else ``default_model``."""
        ...

    # -- the gate's own exchanges (DESIGN §5.1) ------------------------------------

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """The request's conversation items, in order (a plain-text input as one user item)."""
        ...

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The request with ``items`` as its conversation."""
        ...

    def item_anchor(self, item: Any) -> str | None:
        """A key of ``item`` that stays the same in later requests, for the items
        n8n sends back unchanged: a tool output
        (:func:`sidecar.core.gate_writes.output_anchor` of its call id) and a
        user message (:func:`~sidecar.core.gate_writes.user_anchor` of its
        text); None for the others (n8n rewrites an echoed call's arguments)."""
        ...

    def is_user_message(self, item: Any) -> bool:
        """``item`` is a message the user wrote (not a tool output)."""
        ...

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        """The conversation items of one call and its output, as the agent
        itself would send them back after running the tool."""
        ...

    def with_exchange(
        self, body: Mapping[str, Any], proposal: Proposal, output_text: str
    ) -> dict[str, Any]:
        """The request with ``proposal`` and its tool output appended."""
        ...

    def with_kept(self, body: Mapping[str, Any], kept: Sequence[KeptExchange]) -> dict[str, Any]:
        """The request with ``kept`` put back (:func:`sidecar.core.gate_writes.splice`)."""
        ...

    def last_anchor(self, body: Mapping[str, Any]) -> str | None:
        """The anchor a new exchange appended to ``body`` is kept with."""
        ...


def arguments_text(args: Any) -> str:
    """A proposal's arguments as the API's argument text (JSON; text kept as it came)."""
    if isinstance(args, str):
        return args
    return json.dumps(args, separators=(",", ":"), ensure_ascii=False)


def bad(field_path: str, msg: str) -> MalformedRequest:
    """A 400 naming the dotted ``field_path`` of the body."""
    return MalformedRequest(
        f"{field_path}: {msg}", errors=[{"loc": ["body", *field_path.split(".")], "msg": msg}]
    )


def parse_args(raw: Any) -> Any:
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


def token_count(value: Any) -> int | None:
    """``value`` when it is a token count (an int, not a bool, from 0 to
    :data:`MAX_TURN_TOKENS`), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TURN_TOKENS:
        return value
    return None


def check_int(value: Any, field_path: str, low: int, most: int) -> None:
    """Refuse ``value`` (when given) unless it is an integer from ``low`` to ``most``:
    a number no API accepts is a 400 at parse, naming ``field_path``.

    :raises MalformedRequest: naming the field.
    """
    if value is not None and not (
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= most
    ):
        raise bad(field_path, f"must be an integer from {low} to {most}")


def input_bound(body: Mapping[str, Any]) -> int:
    """A bound of the input tokens of the request ``body`` (what is sent
    upstream): its UTF-8 bytes as compact JSON (a byte-level tokenizer's token
    is never shorter than one byte)."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def estimate_tokens(body: Mapping[str, Any], output_chars: int) -> int:
    """An estimate of a turn's tokens when the upstream reported none: the
    request's JSON and the output seen so far, at :data:`CHARS_PER_TOKEN`
    characters per token; never less than 1 (a turn is never free)."""
    chars = len(json.dumps(body, separators=(",", ":"), default=str)) + output_chars
    return max(1, chars // CHARS_PER_TOKEN)


def rfc3339(seconds: int) -> str:
    """Unix ``seconds`` as an RFC 3339 UTC time (``2023-11-14T22:13:20Z``), by the
    proleptic Gregorian calendar (H. Hinnant's ``civil_from_days``): no clock."""
    days, rest = divmod(seconds, 86400)
    z = days + 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    hh, mm, ss = rest // 3600, rest // 60 % 60, rest % 60
    return f"{year:04d}-{month:02d}-{day:02d}T{hh:02d}:{mm:02d}:{ss:02d}Z"


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event (W3C EventSource): ``data`` is JSON-encoded unless a str."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + text.replace("\n", "\ndata: ") + "\n\n").encode()


def sse_frame(frame: Frame) -> bytes:
    """A frame written out again as the upstream sent it."""
    return sse(frame.data, frame.event)


def json_frame(frame: Frame) -> dict[str, Any]:
    """A frame's data as a JSON object.

    :raises StreamBroken: it is not one.
    """
    try:
        data = json.loads(frame.data)
    except ValueError:
        raise StreamBroken(
            "the upstream model sent an unreadable event", "bad_upstream_response"
        ) from None
    if not isinstance(data, dict):
        raise StreamBroken("the upstream model sent an unreadable event", "bad_upstream_response")
    return data
