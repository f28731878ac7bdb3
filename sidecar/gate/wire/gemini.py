"""Google's Gemini API (``POST /{v1beta,v1}/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``): n8n's Google Gemini Chat Model.

Reads ``contents`` (the System Message is ``systemInstruction``; tool
outputs are ``functionResponse`` parts), proposals as ``functionCall`` parts
of the first candidate, usage as ``usageMetadata.totalTokenCount``. The
model is named by the path, and whether the answer streams by the method:
one adapter per method (:data:`GENERATE`, :data:`STREAM`).

The API gives calls no id (n8n 2.41.1 sends none back either: only its own
uuid in the echoed ``args.id``), so the adapter names each call by where it
stands in the conversation (DESIGN §5): ``gemini-<anchor>-<n>``, ``n`` the
call's place among every ``functionCall`` part of ``contents`` (n8n echoes
each relayed call back in order, one model turn per call or one shared
turn) and ``anchor`` a digest of the system text and the contents before
the first call (the user's input and any memory, the same in every turn of
one agent run; a run that opens alike names itself with a
``loopstop-execution`` line, DESIGN §5), so
that a second run on the same task numbers its calls apart
(:meth:`Gemini.number_calls`, for an answer and a stream alike: the reader
gives the calls in order, without ids). A ``functionResponse`` answers the
earliest unanswered call before it with the same tool name.

A stream is ``data: <json>`` frames only, each a whole
``GenerateContentResponse``: n8n's client (``@google/generative-ai``) fails
on an ``event:`` line, a comment or trailing bytes, so every frame is
written again as one compact ``data:`` line. A chunk's ``functionCall``
parts are held (split from its text, which passes); the stream's end is
the end of the turn (its last chunk carries ``finishReason``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.gate.wire._gemini import (
    GeminiConversation,
    _call,
    _get,
    _key,
    _list,
    _numbering,
    _parts,
    call_id,
    seen,
)
from sidecar.gate.wire.base import (
    MAX_CHOICES,
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
    token_count,
)

#: The usage of an answer the gate writes itself.
ZERO_USAGE = {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0}
#: google.rpc canonical codes of HTTP statuses (https://google.aip.dev/193).
STATUS_OF = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
#: The gate's own error codes (base.StreamBroken, the upstream client) as HTTP statuses.
HTTP_OF = {"timeout": 504}


#: Google's Gemini API: the key in ``x-goog-api-key``; n8n's node sends it there on
#: a turn and as ``?key=`` on the model list (its credential test), where the
#: loopstop token is read too and never forwarded.
GEMINI = Api(
    "gemini",
    "x-goog-api-key",
    token_from=(TokenFrom("x-goog-api-key"), TokenFrom(query="key")),
    drop_query=("key",),
)


def _text(parts: Sequence[Mapping[str, Any]]) -> int:
    """The characters of model text in ``parts`` (not thoughts)."""
    return sum(
        len(p["text"]) for p in parts if isinstance(p.get("text"), str) and not p.get("thought")
    )


_count = token_count

#: Request fields whose cost is held upstream, not bounded by the request's bytes.
HELD_UPSTREAM = ("cachedContent",)


def _proposal(fn: Mapping[str, Any]) -> Proposal:
    """A ``functionCall`` as a proposal without an id (:meth:`Gemini.number_calls` gives it)."""
    return Proposal("", str(fn.get("name") or ""), parse_args(fn.get("args")))


def _first(response: Mapping[str, Any]) -> dict[str, Any] | None:
    candidates = _list(response.get("candidates"))
    return candidates[0] if candidates and isinstance(candidates[0], dict) else None


def _output(fr: Mapping[str, Any]) -> Any:
    """A ``functionResponse``'s output: n8n's ``response.result`` (the tool's items
    as JSON text), or the ``response`` object as the API's clients give it."""
    response = fr.get("response")
    if isinstance(response, dict) and len(response) == 1:
        ((key, value),) = response.items()
        if key in ("result", "output"):
            return value
    return response


# -- the gate's own answers --------------------------------------------------------------


def _text_candidate(text: str, finish: str = "STOP") -> dict[str, Any]:
    return {
        "content": {"role": "model", "parts": [{"text": text}]},
        "finishReason": finish,
        "index": 0,
    }


def error_body(message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
    """Google's error object (``{"error": {code, message, status}}``, AIP-193):
    ``code`` the HTTP status the gate answers for its own ``code`` (504 for a
    timeout, else 502), ``status`` its canonical name."""
    http = HTTP_OF.get(code, 502)
    return {"error": {"code": http, "message": message, "status": STATUS_OF[http]}}


class GeminiStream:
    """Reads a Gemini stream: chunks of text pass (written again as one
    ``data:`` line each), the ``functionCall`` parts of a chunk are held in a
    chunk of their own, a chunk with an ``error`` member is the upstream's
    error (``"error": null`` is none, and dropped from the chunk relayed); the
    stream's end closes the turn with the calls (in order, numbered by
    :meth:`Gemini.number_calls`) and the last usage."""

    def __init__(self) -> None:
        self.proposals: list[Proposal] = []
        self.usage: Any = None
        self.base: dict[str, Any] = {}
        self.finished = False

    def feed(self, frame: Frame) -> list[StreamEvent]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.feed`."""
        chunk = json_frame(frame)
        if chunk.get("error") is not None:
            return [ErrorEvent(sse(chunk))]
        chunk.pop("error", None)  # null: no error, and not relayed (Google's clients test the key)
        self.base = chunk
        if chunk.get("usageMetadata") is not None:
            self.usage = chunk["usageMetadata"]
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            self.finished = True
        first = _first(chunk)
        if first is None:
            return [Passed(sse(chunk))]
        if first.get("finishReason"):
            self.finished = True
        parts = _parts(first.get("content"))
        calls = [p for p in parts if _call(p) is not None]
        if not calls:
            return [Passed(sse(chunk), _text(parts))]
        self.proposals.extend(_proposal(fn) for p in calls if (fn := _call(p)) is not None)
        others = [p for p in parts if _call(p) is None]
        held = _with_parts(chunk, first, calls)
        if not others:
            return [Held(sse(held))]
        passed = _with_parts(chunk, first, others)
        passed["candidates"][0].pop("finishReason", None)
        passed.pop("usageMetadata", None)
        return [Passed(sse(passed), _text(others)), Held(sse(held))]

    def end(self) -> Final:
        """See :meth:`sidecar.gate.wire.base.StreamReader.end`: the turn, when its
        last chunk (``finishReason``, or a blocked prompt) came; else broken."""
        if not self.finished:
            raise StreamBroken(
                "the upstream model's stream ended before its last chunk", "upstream_stream_cut"
            )
        return Final(list(self.proposals), Gemini.usage(self.usage))

    def finish(self, held: Sequence[Held], text: str | None, stamp: Stamp) -> list[bytes]:
        """See :meth:`sidecar.gate.wire.base.StreamReader.finish`: the held chunks,
        or one chunk of ``text`` (with the turn's usage) in their place."""
        if text is None:
            return [h.raw for h in held]
        chunk: dict[str, Any] = {
            "candidates": [_text_candidate(text)],
            "usageMetadata": self.usage if isinstance(self.usage, dict) else dict(ZERO_USAGE),
        }
        for name in ("modelVersion", "responseId"):
            if isinstance(self.base.get(name), str):
                chunk[name] = self.base[name]
        return [sse(chunk)]

    def follow_on(self, body: Mapping[str, Any]) -> GeminiStream:
        """See :meth:`sidecar.gate.wire.base.StreamReader.follow_on`: every chunk
        stands alone, so the next stream's chunks continue as they come."""
        return GeminiStream()


def _with_parts(
    chunk: Mapping[str, Any], first: Mapping[str, Any], parts: list[dict[str, Any]]
) -> dict[str, Any]:
    """``chunk`` with its first candidate holding only ``parts``."""
    content = first.get("content")
    content = dict(content) if isinstance(content, dict) else {"role": "model"}
    content[_key(content, "parts")] = parts
    return {**chunk, "candidates": [{**first, "content": content}]}


class Gemini(GeminiConversation):
    """The Gemini adapter (see the module's docstring); ``stream`` says which
    method it serves (``streamGenerateContent`` or ``generateContent``).

    :ivar method: the method in the path (``models/{model}:{method}``).
    """

    api = GEMINI
    framing = Framing.SSE
    system_where = "systemInstruction"
    models_path = "/v1beta/models"

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.method = "streamGenerateContent" if stream else "generateContent"
        self.name = "gemini_stream" if stream else "gemini"
        #: the route below ``/v1/gemini`` (the request's own path is forwarded)
        self.path = f"/<any(v1beta, v1):version>/models/<model>:{self.method}"

    def validate(self, body: Mapping[str, Any]) -> None:
        """``contents`` (a non-empty list of contents, each with a list of part
        objects), ``systemInstruction`` (a content), ``tools`` (a list),
        ``generationConfig`` (an object; its ``maxOutputTokens`` an integer from 1 to
        :data:`~sidecar.gate.wire.base.MAX_OUTPUT_LIMIT`, its ``candidateCount``
        from 1 to :data:`~sidecar.gate.wire.base.MAX_CHOICES`).

        :raises MalformedRequest: naming the field.
        """
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise bad("contents", "must be a non-empty list of contents")
        for i, content in enumerate(contents):
            _content(content, f"contents.{i}")
        si = _key(body, "systemInstruction")
        if body.get(si) is not None:
            _content(body[si], si)
        for name, kind, label in (
            ("tools", list, "a list"),
            ("generationConfig", dict, "an object"),
        ):
            key = _key(body, name)
            if body.get(key) is not None and not isinstance(body[key], kind):
                raise bad(key, f"must be {label}")
        config = body.get(_key(body, "generationConfig"))
        if isinstance(config, dict):
            where = _key(body, "generationConfig")
            for name, most in (
                ("maxOutputTokens", MAX_OUTPUT_LIMIT),
                ("candidateCount", MAX_CHOICES),
            ):
                key = _key(config, name)
                check_int(config.get(key), f"{where}.{key}", 1, most)

    def streaming(self, body: Mapping[str, Any]) -> bool:
        """The method says it: ``streamGenerateContent``."""
        return self.stream

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The path's model (``models/{model}``)."""
        model = route.get("model")
        return model or None

    def system_texts(self, body: Mapping[str, Any]) -> list[str]:
        """The text parts of ``systemInstruction`` (n8n's System Message), as one text."""
        si = _get(body, "systemInstruction")
        texts = [p["text"] for p in _parts(si) if isinstance(p.get("text"), str)]
        return ["\n".join(texts)] if texts else []

    def tool_outputs(self, body: Mapping[str, Any]) -> list[ToolOutput]:
        """The ``functionResponse`` parts, each answering the earliest call before
        it with its tool name that no output answered yet (the calls numbered as
        :func:`call_id` names them; the gate's own exchanges answer nothing)."""
        anchor, _ = _numbering(body)
        calls: list[tuple[str, Any]] = []
        answered: set[int] = set()
        out: list[ToolOutput] = []
        for content in seen(_list(body.get("contents"))):
            for part in _parts(content):
                fn = _call(part)
                if fn is not None:
                    calls.append((call_id(anchor, len(calls)), fn.get("name")))
                    continue
                fr = _get(part, "functionResponse")
                if not isinstance(fr, dict):
                    continue
                name = fr.get("name")
                n = next(
                    (i for i, c in enumerate(calls) if i not in answered and c[1] == name), None
                )
                if n is not None:
                    answered.add(n)
                    out.append(ToolOutput(calls[n][0], _output(fr)))
        return out

    def offered_tools(self, body: Mapping[str, Any]) -> frozenset[str] | None:
        """``tools[].functionDeclarations[].name`` (None: no ``tools`` list)."""
        tools = _get(body, "tools")
        if not isinstance(tools, list):
            return None
        return frozenset(
            d["name"]
            for tool in tools
            for d in _list(_get(tool, "functionDeclarations"))
            if isinstance(d, dict) and isinstance(d.get("name"), str)
        )

    def max_output_tokens(self, body: Mapping[str, Any]) -> int | None:
        """``generationConfig.maxOutputTokens``."""
        value = _get(_get(body, "generationConfig"), "maxOutputTokens")
        return value if _count(value) else None

    def spend(self, body: Mapping[str, Any]) -> Spend:
        """``generationConfig.candidateCount`` choices; unbounded: ``cachedContent``
        (context held upstream), a tool that is not ``functionDeclarations``
        (Google Search, code execution, URL context, file search: run and billed
        at Google), a ``fileData`` part (media by URI)."""
        for name in HELD_UPSTREAM:
            key = _key(body, name)
            if body.get(key) not in (None, ""):
                return Spend(unbounded=key)
        for i, tool in enumerate(_list(_get(body, "tools"))):
            for key in tool if isinstance(tool, dict) else ():
                if key not in ("functionDeclarations", "function_declarations"):
                    return Spend(unbounded=f"tools.{i}.{key}")
        contents_key = _key(body, "contents")
        for i, content in enumerate(_list(body.get(contents_key))):
            parts_key = _key(content, "parts") if isinstance(content, dict) else "parts"
            for j, part in enumerate(_parts(content)):
                if _get(part, "fileData") is not None:
                    return Spend(unbounded=f"{contents_key}.{i}.{parts_key}.{j}")
        count = _get(_get(body, "generationConfig"), "candidateCount")
        return Spend(choices=count if isinstance(count, int) and count > 0 else 1)

    def with_output_limit(self, body: Mapping[str, Any], limit: int) -> dict[str, Any]:
        """``generationConfig.maxOutputTokens`` (the rest of ``generationConfig`` kept)."""
        key = _key(body, "generationConfig")
        config = body.get(key)
        config = dict(config) if isinstance(config, dict) else {}
        config[_key(config, "maxOutputTokens")] = limit
        return {**body, key: config}

    def number_calls(self, body: Mapping[str, Any], proposals: list[Proposal]) -> list[Proposal]:
        """The proposals named after the calls ``body`` holds (see the module's
        docstring): ``gemini-<anchor>-<n>``, the names :meth:`tool_outputs` reads
        back. An ``id`` the upstream may give is not kept: n8n sends none back."""
        anchor, n = _numbering(body)
        return [Proposal(call_id(anchor, n + k), p.tool, p.args) for k, p in enumerate(proposals)]

    def read_answer(self, answer: Any) -> Answer:
        """The first candidate's ``functionCall`` parts (without ids:
        :meth:`number_calls`) and ``usageMetadata``.

        :raises NotThisAnswer: not an object with ``candidates`` or ``promptFeedback``.
        """
        if not isinstance(answer, dict) or not (
            "candidates" in answer or "promptFeedback" in answer
        ):
            raise NotThisAnswer(
                "the upstream model answered something that is not a GenerateContentResponse"
            )
        first = _first(answer)
        calls = [fn for p in _parts(first and first.get("content")) if (fn := _call(p))]
        return Answer([_proposal(fn) for fn in calls], self.usage(answer.get("usageMetadata")))

    @staticmethod
    def usage(usage: Any) -> Usage:
        """``totalTokenCount``; priced by ``promptTokenCount`` (+ tool-use prompt)
        in and the rest out (candidates and thoughts). Counts left out are 0
        (proto3 JSON drops zeros); the total is required."""
        if not isinstance(usage, dict):
            return Usage()
        total = _count(usage.get("totalTokenCount"))
        if total is None:
            return Usage()
        prompt = (_count(usage.get("promptTokenCount")) or 0) + (
            _count(usage.get("toolUsePromptTokenCount")) or 0
        )
        return Usage(total, (min(prompt, total), max(0, total - prompt)))

    def with_wrap_up(self, body: Mapping[str, Any], note: str) -> dict[str, Any]:
        """``note`` as a last text part of ``systemInstruction`` (made when absent)."""
        out = copy.copy(dict(body))
        key = _key(body, "systemInstruction")
        si = body.get(key)
        si = dict(si) if isinstance(si, dict) else {}
        parts_key = _key(si, "parts")
        si[parts_key] = [*_list(si.get(parts_key)), {"text": note}]
        out[key] = si
        return out

    def forward_payload(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """The body as it came (the model is in the path, a stream reports its usage)."""
        return dict(body)

    def final_answer(self, text: str, model: str, stamp: Stamp) -> dict[str, Any]:
        """A ``GenerateContentResponse`` with one candidate: ``text``, ``finishReason: STOP``."""
        return {
            "candidates": [_text_candidate(text)],
            "usageMetadata": dict(ZERO_USAGE),
            "modelVersion": model,
            "responseId": stamp.id("loopstop-"),
        }

    def final_stream(
        self, text: str, model: str, stamp: Stamp, body: Mapping[str, Any]
    ) -> list[bytes]:
        """The final answer as the stream's one ``data:`` chunk."""
        return [sse(self.final_answer(text, model, stamp))]

    def replace_with_text(self, answer: Mapping[str, Any], text: str, stamp: Stamp) -> Any:
        """The answer with one candidate: ``text``, ``finishReason: STOP``."""
        return {**answer, "candidates": [_text_candidate(text)]}

    def error_body(self, message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
        """See :func:`error_body`."""
        return error_body(message, code, kind)

    def upstream_error_body(self, status: int, answer: Any) -> dict[str, Any]:
        """The upstream's own body when it is Google's error object, else one naming ``status``."""
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            return answer
        return {
            "error": {
                "code": status,
                "message": f"the upstream model answered {status}",
                "status": STATUS_OF.get(status, "UNKNOWN"),
            }
        }

    def error_event(self, message: str, code: str) -> bytes:
        """A chunk that is Google's error object first (Google's SDKs raise on a
        chunk that starts with ``{"error":``), with a candidate stating it:
        n8n's client skips a chunk without candidates, so the agent's answer
        says what broke instead of ending blank."""
        chunk = {
            **error_body(message, code, "upstream_error"),
            "candidates": [_text_candidate(f"[loopstop] {message} ({code}).", "OTHER")],
        }
        return sse(chunk)

    def stream_reader(self, body: Mapping[str, Any]) -> GeminiStream:
        """A :class:`GeminiStream`."""
        return GeminiStream()

    def model_list(self, listed: Any, default_model: str) -> dict[str, Any]:
        """``GET /models``: the upstream's list, or one naming ``default_model``."""
        if isinstance(listed, dict) and isinstance(listed.get("models"), list):
            return listed
        name = default_model if default_model.startswith("models/") else f"models/{default_model}"
        return {
            "models": [
                {
                    "name": name,
                    "displayName": default_model.removeprefix("models/"),
                    "supportedGenerationMethods": ["generateContent", "streamGenerateContent"],
                }
            ]
        }


def _content(content: Any, where: str) -> None:
    """Check one ``Content``: an object whose ``parts`` is a list of objects.

    :raises MalformedRequest: naming the field.
    """
    if not isinstance(content, dict):
        raise bad(where, "must be a content object")
    role = content.get("role")
    if role is not None and not isinstance(role, str):
        raise bad(f"{where}.role", "must be a string")
    key = _key(content, "parts")
    parts = content.get(key)
    if parts is None:
        return
    if not isinstance(parts, list):
        raise bad(f"{where}.{key}", "must be a list of parts")
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise bad(f"{where}.{key}.{j}", "each part must be an object")


#: ``:generateContent``.
GENERATE = Gemini(stream=False)
#: ``:streamGenerateContent`` (``alt=sse``).
STREAM = Gemini(stream=True)
