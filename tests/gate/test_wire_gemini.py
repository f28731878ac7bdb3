"""The Gemini wire adapter as pure tables (DESIGN §5, STYLE 18): wire samples as
n8n 2.41.1's Google Gemini Chat Model sends them in, parsed parts out; every
answer, chunk and error the gate writes itself is validated against the
official ``google-genai`` SDK's types. No app, no store, no socket."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from google.genai import types

from sidecar.errors import MalformedRequest
from sidecar.gate.wire import GEMINI_GENERATE, GEMINI_STREAM
from sidecar.gate.wire.base import (
    ErrorEvent,
    Final,
    Frame,
    Held,
    NotThisAnswer,
    Passed,
    Proposal,
    Stamp,
    StreamBroken,
    StreamEvent,
    StreamReader,
    ToolOutput,
    Usage,
)

STAMP = Stamp(1_700_000_000, "0123456789abcdef01234567")
TEXT = "[loopstop] This task has ended: partial (same_call)."
SIG = "U0lHLUZST00tVVBTVFJFQU0="
#: n8n's client reads a stream with this, anchored at the buffer's start
#: (``@google/generative-ai`` 0.24.0 ``responseLineRE``): nothing else may come.
N8N_LINE = re.compile(rb"^data: (.*)(?:\n\n|\r\r|\r\n\r\n)")
TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "echo",
                "description": "Echoes q back.",
                "parameters": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                    "required": ["q"],
                },
            },
            {"name": "lookup"},
        ]
    },
    {"googleSearch": {}},
]
USER = {"role": "user", "parts": [{"text": "hi"}]}
SYSTEM = {"role": "system", "parts": [{"text": "You are X.\nloopstop-task-key: T-1"}]}


def first_turn(**extra: Any) -> dict[str, Any]:
    """The first request, as n8n sends it (wire-facts §3.4)."""
    return {
        "generationConfig": {"stopSequences": []},
        "safetySettings": [],
        "tools": TOOLS,
        "systemInstruction": SYSTEM,
        "contents": [USER],
        **extra,
    }


def echoed(args: dict[str, Any], uuid: str, signature: str | None = None) -> dict[str, Any]:
    """A relayed call as n8n sends it back: its uuid added to the args, no id."""
    part: dict[str, Any] = {"functionCall": {"name": "echo", "args": {**args, "id": uuid}}}
    if signature:
        part["thoughtSignature"] = signature
    return {"role": "model", "parts": [part]}


def output(result: str, name: str = "echo") -> dict[str, Any]:
    return {
        "role": "user",
        "parts": [{"functionResponse": {"name": name, "response": {"result": result}}}],
    }


def later_turn(*history: dict[str, Any]) -> dict[str, Any]:
    body = first_turn()
    body["contents"] = [USER, *history]
    return body


def answer(*parts: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "candidates": [
            {"content": {"role": "model", "parts": list(parts)}, "finishReason": "STOP", "index": 0}
        ],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "resp1",
    }
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def call(q: str, signature: str | None = None, name: str = "echo") -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": {"q": q}}}
    if signature:
        part["thoughtSignature"] = signature
    return part


USAGE = {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18}


def ids(body: dict[str, Any], n: int) -> list[str]:
    """The ids the adapter gives the next ``n`` calls proposed to ``body``."""
    return [p.call_id for p in numbered(answer(*[call(str(i)) for i in range(n)]), body)]


def numbered(up: Any, body: dict[str, Any]) -> list[Proposal]:
    """The proposals of the answer ``up`` to ``body``, numbered as the gate numbers them."""
    return GEMINI_GENERATE.number_calls(body, GEMINI_GENERATE.read_answer(up).proposals)


def sdk_chunks(raw: list[bytes]) -> list[types.GenerateContentResponse]:
    """The stream as n8n's client splits it (nothing else may stand between
    frames), each chunk a ``GenerateContentResponse`` the SDK accepts."""
    rest = b"".join(raw)
    out = []
    while rest:
        match = N8N_LINE.match(rest)
        assert match is not None, f"n8n's client fails on {rest[:60]!r}"
        out.append(types.GenerateContentResponse.model_validate_json(match.group(1)))
        rest = rest[match.end() :]
    return out


def frame(data: Any) -> Frame:
    return Frame(data if isinstance(data, str) else json.dumps(data))


def feed_all(reader: StreamReader, frames: list[Frame]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    for f in frames:
        out.extend(reader.feed(f))
    return out


# -- reading requests ------------------------------------------------------------------


def test_a_request_s_parts_are_read_where_n8n_puts_them() -> None:
    body = first_turn(generationConfig={"maxOutputTokens": 2048})
    GEMINI_GENERATE.validate(body)
    assert GEMINI_GENERATE.system_texts(body) == ["You are X.\nloopstop-task-key: T-1"]
    assert GEMINI_GENERATE.offered_tools(body) == frozenset({"echo", "lookup"})
    assert GEMINI_GENERATE.max_output_tokens(body) == 2048
    assert GEMINI_GENERATE.tool_outputs(body) == []
    assert GEMINI_GENERATE.model(body, {"model": "gemini-2.5-flash"}) == "gemini-2.5-flash"
    assert GEMINI_GENERATE.streaming(body) is False
    assert GEMINI_STREAM.streaming(body) is True


@pytest.mark.parametrize(
    ("body", "tools"),
    [
        ({"contents": [USER]}, None),
        ({"contents": [USER], "tools": []}, frozenset()),
        ({"contents": [USER], "tools": [{"googleSearch": {}}]}, frozenset()),
        ({"contents": [USER], "tools": [{"function_declarations": [{"name": "s"}]}]}, {"s"}),
        (
            {"contents": [USER], "tools": [{"functionDeclarations": [{"name": "a"}, {"x": 1}]}]},
            {"a"},
        ),
        ({"contents": [USER], "tools": [{"functionDeclarations": [{"name": 3}]}, "x"]}, set()),
    ],
)
def test_the_offered_tools_are_exactly_the_declared_functions(
    body: dict[str, Any], tools: Any
) -> None:
    """A tool the request did not declare is not offered (the gate's invalid_call
    rule relies on it); no ``tools`` list offers no list at all (None)."""
    got = GEMINI_GENERATE.offered_tools(body)
    assert got == (None if tools is None else frozenset(tools))


def test_the_system_message_may_be_snake_case_or_absent() -> None:
    body = {"contents": [USER], "system_instruction": {"parts": [{"text": "a"}, {"text": "b"}]}}
    GEMINI_GENERATE.validate(body)
    assert GEMINI_GENERATE.system_texts(body) == ["a\nb"]
    assert GEMINI_GENERATE.system_texts({"contents": [USER]}) == []
    assert GEMINI_GENERATE.model({}, {}) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, ["contents"]),
        ({"contents": []}, ["contents"]),
        ({"contents": "hi"}, ["contents"]),
        ({"contents": ["hi"]}, ["contents", "0"]),
        ({"contents": [{"role": 1, "parts": []}]}, ["contents", "0", "role"]),
        ({"contents": [{"parts": {"text": "x"}}]}, ["contents", "0", "parts"]),
        ({"contents": [USER, {"parts": ["x"]}]}, ["contents", "1", "parts", "0"]),
        ({"contents": [USER], "systemInstruction": "be nice"}, ["systemInstruction"]),
        (
            {"contents": [USER], "system_instruction": {"parts": "x"}},
            ["system_instruction", "parts"],
        ),
        ({"contents": [USER], "tools": {}}, ["tools"]),
        ({"contents": [USER], "generationConfig": []}, ["generationConfig"]),
    ],
)
def test_a_body_not_of_the_api_s_shape_is_refused_naming_the_field(
    body: dict[str, Any], field: list[str]
) -> None:
    with pytest.raises(MalformedRequest) as caught:
        GEMINI_GENERATE.validate(body)
    assert caught.value.extra["errors"][0]["loc"] == ["body", *field]


# -- call ids: numbered by position, matched by position and name -----------------------


def test_a_relayed_call_keeps_its_id_when_n8n_sends_it_back() -> None:
    """The id a proposal gets is the id its output comes back under: n8n drops
    the call's id (it adds its own uuid to the args) and the API has none."""
    (first,) = ids(first_turn(), 1)
    body = later_turn(echoed({"q": "a"}, "f73bae29-d0ad-43ed-82c5-3d0df50fb273"), output("[a]"))
    assert GEMINI_GENERATE.tool_outputs(body) == [ToolOutput(first, "[a]")]
    (second,) = ids(body, 1)
    assert second != first
    body3 = later_turn(
        echoed({"q": "a"}, "uuid-1"), output("[a]"), echoed({"q": "a"}, "uuid-2"), output("[b]")
    )
    assert GEMINI_GENERATE.tool_outputs(body3) == [
        ToolOutput(first, "[a]"),
        ToolOutput(second, "[b]"),
    ]


def test_parallel_calls_are_matched_split_up_or_in_one_shared_turn() -> None:
    """Two calls of one answer come back as two model/user pairs (Gemini 2.5), or
    one shared model turn with n8n's own text and two user turns (Gemini 3 with
    a thoughtSignature); either way each output finds its call."""
    a, b = ids(first_turn(), 2)
    split = later_turn(echoed({"q": "a"}, "u1"), output("A"), echoed({"q": "b"}, "u2"), output("B"))
    shared = later_turn(
        {
            "role": "model",
            "parts": [
                {"text": "Calling tools: echo, echo"},
                {
                    "functionCall": {"name": "echo", "args": {"q": "a", "id": "u1"}},
                    "thoughtSignature": SIG,
                },
                {
                    "functionCall": {"name": "echo", "args": {"q": "b", "id": "u2"}},
                    "thoughtSignature": "x",
                },
            ],
        },
        output("A"),
        output("B"),
    )
    expected = [ToolOutput(a, "A"), ToolOutput(b, "B")]
    assert GEMINI_GENERATE.tool_outputs(split) == expected
    assert GEMINI_GENERATE.tool_outputs(shared) == expected


def test_an_output_is_matched_by_tool_name_and_an_unmatched_one_is_skipped() -> None:
    body = first_turn()
    a, b = (
        p.call_id for p in numbered(answer(call("a", name="echo"), call("b", name="lookup")), body)
    )
    history = later_turn(
        {"role": "model", "parts": [call("a", name="echo"), call("b", name="lookup")]},
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "lookup", "response": {"result": "B"}}},
                {"functionResponse": {"name": "nobody", "response": {"result": "?"}}},
                {"functionResponse": {"name": "echo", "response": {"output": {"x": 1}}}},
                {"functionResponse": {"name": "echo", "response": {"result": "again"}}},
            ],
        },
    )
    assert GEMINI_GENERATE.tool_outputs(history) == [ToolOutput(b, "B"), ToolOutput(a, {"x": 1})]


def test_another_conversation_numbers_its_calls_apart() -> None:
    """A second agent run on the same task (another input, or memory before it)
    gets other ids: an output of one run never settles a call of another."""
    mine = ids(first_turn(), 1)
    other = first_turn()
    other["contents"] = [{"role": "user", "parts": [{"text": "something else"}]}]
    assert ids(other, 1) != mine
    assert ids(first_turn(), 1) == mine  # pure: the same request, the same ids


def test_a_tool_error_is_the_response_object_as_sent() -> None:
    (a,) = ids(first_turn(), 1)
    error = {"error": {"details": "boom"}, "extra": 1}
    body = later_turn(
        echoed({"q": "a"}, "u"),
        {"role": "user", "parts": [{"functionResponse": {"name": "echo", "response": error}}]},
    )
    assert GEMINI_GENERATE.tool_outputs(body) == [ToolOutput(a, error)]


# -- reading answers -------------------------------------------------------------------


def test_an_answer_s_proposals_and_usage_are_read() -> None:
    """Calls of the first candidate only (n8n's client reads no other), args as
    the upstream made them, the thoughtSignature kept in the relayed answer."""
    body = first_turn()
    up = answer({"text": "Let me call echo."}, call("a", SIG), usage=USAGE)
    up["candidates"].append({"content": {"role": "model", "parts": [call("other")]}, "index": 1})
    read = GEMINI_GENERATE.read_answer(up)
    assert read.proposals == [Proposal("", "echo", {"q": "a"})]  # ids: number_calls
    assert numbered(up, body) == [Proposal(ids(body, 1)[0], "echo", {"q": "a"})]
    assert read.usage == Usage(18, (11, 7))
    types.GenerateContentResponse.model_validate(up)


@pytest.mark.parametrize(
    "up", [None, "candidates", ["candidates"], {"choices": []}, {"error": {"code": 1}}]
)
def test_an_answer_of_another_shape_is_not_this_api_s_answer(up: Any) -> None:
    with pytest.raises(NotThisAnswer, match="not a GenerateContentResponse"):
        GEMINI_GENERATE.read_answer(up)


@pytest.mark.parametrize(
    "up",
    [
        {"promptFeedback": {"blockReason": "SAFETY"}},
        {"candidates": []},
        {"candidates": ["x", {"content": "no"}]},
        {"candidates": [{"content": {"parts": [{"functionCall": "x"}, 1]}}]},
        {"candidates": [{"finishReason": "SAFETY"}]},
    ],
)
def test_an_answer_proposing_nothing_readable_proposes_nothing(up: Any) -> None:
    assert GEMINI_GENERATE.read_answer(up).proposals == []


@pytest.mark.parametrize(
    ("usage", "read"),
    [
        (USAGE, (18, (11, 7))),
        ({"promptTokenCount": 11, "totalTokenCount": 11}, (11, (11, 0))),
        (  # thoughts are output; a tool-use prompt is input
            {
                "promptTokenCount": 10,
                "toolUsePromptTokenCount": 2,
                "candidatesTokenCount": 3,
                "thoughtsTokenCount": 5,
                "totalTokenCount": 20,
            },
            (20, (12, 8)),
        ),
        ({"totalTokenCount": 9}, (9, (0, 9))),
        ({"promptTokenCount": 11, "candidatesTokenCount": 7}, (None, None)),
        ({"totalTokenCount": True}, (None, None)),
        ({"totalTokenCount": -1}, (None, None)),
        (None, (None, None)),
        ("18", (None, None)),
    ],
)
def test_usage_is_the_total_token_count_and_malformed_usage_is_none(
    usage: Any, read: tuple[Any, Any]
) -> None:
    assert GEMINI_GENERATE.usage(usage) == Usage(*read)


# -- streams -----------------------------------------------------------------------------


def test_a_stream_passes_text_holds_calls_and_ends_with_the_turn() -> None:
    body = first_turn()
    reader = GEMINI_STREAM.stream_reader(body)
    text = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "FINAL: "}]}, "index": 0}]
    }
    mixed = answer({"text": "Let me "}, call("a", SIG), usage=USAGE)
    events = feed_all(reader, [frame(text), frame(mixed)])
    assert [type(e) for e in events] == [Passed, Passed, Held]
    assert [e.chars for e in events if isinstance(e, Passed)] == [7, 7]
    passed, held = sdk_chunks([events[1].raw]), sdk_chunks([events[2].raw])
    assert passed[0].text == "Let me " and passed[0].candidates[0].finish_reason is None
    assert held[0].function_calls[0].args == {"q": "a"}
    assert held[0].candidates[0].content.parts[0].thought_signature == b"SIG-FROM-UPSTREAM"
    assert held[0].usage_metadata.total_token_count == 18
    final = reader.end()
    assert final == Final([Proposal("", "echo", {"q": "a"})], Usage(18, (11, 7)))
    numbered_calls = GEMINI_STREAM.number_calls(body, final.proposals)
    assert numbered_calls == [Proposal(ids(body, 1)[0], "echo", {"q": "a"})]
    assert reader.finish([e for e in events if isinstance(e, Held)], None, STAMP) == [events[2].raw]


def test_a_denied_stream_ends_with_one_text_chunk_and_the_usage() -> None:
    reader = GEMINI_STREAM.stream_reader(first_turn())
    events = feed_all(reader, [frame(answer(call("a"), usage=USAGE))])
    assert isinstance(events[0], Held) and isinstance(reader.end(), Final)
    (chunk,) = sdk_chunks(reader.finish([events[0]], TEXT, STAMP))
    assert chunk.text == TEXT and chunk.function_calls is None
    assert chunk.candidates[0].finish_reason == types.FinishReason.STOP
    assert chunk.usage_metadata.total_token_count == 18 and chunk.response_id == "resp1"


def test_a_stream_is_written_again_as_n8n_s_client_reads_it() -> None:
    """Multi-line data and a named event (which n8n's client fails on) come out
    as one compact ``data:`` line each."""
    reader = GEMINI_STREAM.stream_reader(first_turn())
    pretty = json.dumps(answer({"text": "a\nb"}), indent=2)
    (event,) = reader.feed(Frame(pretty, "message_delta"))
    assert isinstance(event, Passed)
    assert sdk_chunks([event.raw])[0].text == "a\nb"


def test_a_stream_without_its_last_chunk_is_cut_and_an_error_chunk_is_relayed() -> None:
    reader = GEMINI_STREAM.stream_reader(first_turn())
    reader.feed(frame({"candidates": [{"content": {"parts": [{"text": "x"}]}, "index": 0}]}))
    with pytest.raises(StreamBroken) as cut:
        reader.end()
    assert cut.value.code == "upstream_stream_cut"
    error = {"error": {"code": 500, "message": "fake", "status": "INTERNAL"}}
    (event,) = GEMINI_STREAM.stream_reader(first_turn()).feed(frame(error))
    assert isinstance(event, ErrorEvent) and json.loads(event.raw[6:]) == error
    with pytest.raises(StreamBroken):
        reader.feed(Frame("{not json"))
    blocked = GEMINI_STREAM.stream_reader(first_turn())
    blocked.feed(frame({"promptFeedback": {"blockReason": "SAFETY"}}))
    assert blocked.end() == Final([], Usage())


def test_calls_spread_over_chunks_are_numbered_in_order() -> None:
    body = later_turn(echoed({"q": "a"}, "u"), output("A"))
    reader = GEMINI_STREAM.stream_reader(body)
    feed_all(reader, [frame(answer(call("b"))), frame(answer(call("c"), usage=USAGE))])
    proposals = GEMINI_STREAM.number_calls(body, reader.end().proposals)
    assert [p.call_id for p in proposals] == ids(body, 2)


# -- the gate's own answers, against the SDK's types -----------------------------------


def test_the_gate_s_final_answer_and_stream_are_valid_sdk_objects() -> None:
    done = types.GenerateContentResponse.model_validate(
        GEMINI_GENERATE.final_answer(TEXT, "gemini-2.5-flash", STAMP)
    )
    assert done.text == TEXT and done.candidates[0].finish_reason == types.FinishReason.STOP
    assert done.response_id == STAMP.id("loopstop-") and done.model_version == "gemini-2.5-flash"
    (chunk,) = sdk_chunks(GEMINI_STREAM.final_stream(TEXT, "m", STAMP, first_turn()))
    assert chunk.text == TEXT


def test_a_replaced_answer_keeps_the_upstream_s_fields_and_holds_only_the_text() -> None:
    up = answer({"text": "Let me"}, call("a", SIG), usage=USAGE)
    replaced = types.GenerateContentResponse.model_validate(
        GEMINI_GENERATE.replace_with_text(up, TEXT, STAMP)
    )
    assert replaced.text == TEXT and replaced.function_calls is None
    assert replaced.response_id == "resp1" and replaced.usage_metadata.total_token_count == 18


def test_a_wrap_up_note_is_the_last_system_part_and_the_request_is_not_changed() -> None:
    body = first_turn()
    before = copy.deepcopy(body)
    wrapped = GEMINI_GENERATE.with_wrap_up(body, "Conclude now.")
    assert wrapped["systemInstruction"] == {
        "role": "system",
        "parts": [{"text": "You are X.\nloopstop-task-key: T-1"}, {"text": "Conclude now."}],
    }
    assert body == before and wrapped["contents"] == body["contents"]
    bare = GEMINI_GENERATE.with_wrap_up({"contents": [USER]}, "Conclude now.")
    assert bare["systemInstruction"] == {"parts": [{"text": "Conclude now."}]}
    snake = GEMINI_GENERATE.with_wrap_up({"system_instruction": {"parts": []}}, "n")
    assert snake == {"system_instruction": {"parts": [{"text": "n"}]}}


def test_the_forwarded_payload_is_the_request_as_it_came() -> None:
    body = later_turn(echoed({"q": "a"}, "u", SIG), output("A"))
    assert GEMINI_STREAM.forward_payload(body, "gemini-3-flash-preview") == body


@pytest.mark.parametrize(
    ("code", "http", "status"),
    [
        ("timeout", 504, "DEADLINE_EXCEEDED"),
        ("upstream_unreachable", 502, "UNAVAILABLE"),
        ("bad_upstream_response", 502, "UNAVAILABLE"),
        ("upstream_stream_cut", 502, "UNAVAILABLE"),
    ],
)
def test_errors_are_google_s_error_object(code: str, http: int, status: str) -> None:
    body = GEMINI_GENERATE.error_body("it broke", code)
    assert body == {"error": {"code": http, "message": "it broke", "status": status}}


def test_an_upstream_error_is_relayed_as_is_or_named_by_its_status() -> None:
    own = {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}
    assert GEMINI_GENERATE.upstream_error_body(429, own) is own
    assert GEMINI_GENERATE.upstream_error_body(404, "<html>") == {
        "error": {"code": 404, "message": "the upstream model answered 404", "status": "NOT_FOUND"}
    }
    assert GEMINI_GENERATE.upstream_error_body(418, None)["error"]["status"] == "UNKNOWN"


def test_a_broken_stream_ends_with_an_error_chunk_google_s_sdk_raises_and_n8n_shows() -> None:
    """Google's SDK raises on a chunk that starts with ``{"error":``; n8n's client
    skips a chunk without candidates, so the chunk also says it as text."""
    raw = GEMINI_STREAM.error_event("the upstream model's stream broke", "upstream_stream_cut")
    match = N8N_LINE.match(raw)
    assert match is not None and match.end() == len(raw)
    assert match.group(1).startswith(b'{"error":')
    data = json.loads(match.group(1))
    assert data["error"] == {
        "code": 502,
        "message": "the upstream model's stream broke",
        "status": "UNAVAILABLE",
    }
    shown = types.GenerateContentResponse.model_validate({"candidates": data["candidates"]})
    assert "stream broke" in (shown.text or "")


def test_the_model_list_is_the_upstream_s_or_names_the_default_model() -> None:
    """n8n's picker keeps the models whose ``supportedGenerationMethods`` hold
    ``generateContent`` (the SDK's own client reads the list in the app's tests)."""
    listed = {"models": [{"name": "models/gemini-2.5-flash"}]}
    assert GEMINI_GENERATE.model_list(listed, "x") is listed
    (made,) = GEMINI_GENERATE.model_list(None, "gemini-x")["models"]
    assert made["name"] == "models/gemini-x" and made["displayName"] == "gemini-x"
    assert "generateContent" in made["supportedGenerationMethods"]
    assert GEMINI_GENERATE.model_list({"data": []}, "models/m")["models"][0]["name"] == "models/m"


# -- the gate's own exchanges (DESIGN §5.1) ---------------------------------------------------

RECEIPT = '{"id":"lead-1"}'


def own(proposal: Proposal) -> Proposal:
    """The proposal under the gate's own id (as the gate answers it)."""
    from sidecar.core.gate_writes import own_call_id

    return Proposal(own_call_id(proposal.call_id, "0a1b2c3d"), proposal.tool, proposal.args)


def test_an_exchange_is_a_model_call_under_the_gate_s_id_then_its_function_response() -> None:
    (write,) = numbered(answer(call("a")), first_turn())
    mine = own(write)
    out = GEMINI_GENERATE.with_exchange(first_turn(), mine, RECEIPT)
    assert out["contents"][:1] == [USER]
    assert out["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": mine.call_id, "name": "echo", "args": {"q": "a"}},
                    "thoughtSignature": "skip_thought_signature_validator",
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": mine.call_id,
                        "name": "echo",
                        "response": {"result": RECEIPT},
                    }
                }
            ],
        },
    ]
    for content in out["contents"]:  # contents Google's own SDK type reads
        types.Content.model_validate(content)
    assert {k: v for k, v in out.items() if k != "contents"} == {
        k: v for k, v in first_turn().items() if k != "contents"
    }
    odd = GEMINI_GENERATE.with_exchange(first_turn(), own(Proposal("p", "t", "text")), "r")
    assert odd["contents"][1]["parts"][0]["functionCall"]["args"] == {}


def test_a_gate_answered_exchange_never_shifts_the_numbers_of_n8n_s_calls() -> None:
    """The request with the gate's exchange numbers its next proposal as n8n's own
    conversation does (the gate's call is not counted), its output answers no
    call of n8n's, and n8n's output of the next call is read under that call's id."""
    (write,) = numbered(answer(call("a")), first_turn())
    asked = GEMINI_GENERATE.with_exchange(first_turn(), own(write), RECEIPT)
    (read,) = numbered(answer(call("b")), asked)
    assert read.call_id == write.call_id == ids(first_turn(), 1)[0]
    assert GEMINI_GENERATE.tool_outputs(asked) == []
    later = later_turn(echoed({"q": "b"}, "uuid-1"), output('[{"r":"b"}]'))
    spliced = GEMINI_GENERATE.with_exchange(later, own(Proposal("x", "echo", {"q": "c"})), "r")
    assert GEMINI_GENERATE.tool_outputs(later) == [ToolOutput(read.call_id, '[{"r":"b"}]')]
    assert GEMINI_GENERATE.tool_outputs(spliced) == GEMINI_GENERATE.tool_outputs(later)
    (nxt,) = numbered(answer(call("d")), spliced)
    assert nxt.call_id.endswith("-1")  # after n8n's one call, not after the gate's two


def test_a_turn_of_calls_and_its_outputs_are_one_item_an_exchange_never_splits() -> None:
    from sidecar.core.gate_writes import KeptExchange, output_anchor, user_anchor

    two = {"role": "model", "parts": [call("a"), call("b")]}
    body = later_turn(two, output("1"), output("2"))
    items = GEMINI_GENERATE.conversation(body)
    assert [len(i.contents) for i in items] == [1, 3]
    assert [GEMINI_GENERATE.item_anchor(i) for i in items] == [
        user_anchor("hi"),
        output_anchor(ids(first_turn(), 2)[1]),
    ]
    assert [GEMINI_GENERATE.is_user_message(i) for i in items] == [True, False]
    assert GEMINI_GENERATE.with_conversation(body, items) == body
    kept = KeptExchange(
        GEMINI_GENERATE.last_anchor(body),
        own(Proposal("p", "echo", {})).call_id,
        "echo",
        {},
        "r",
        "replay",
        "o",
        0,
    )
    more = {"role": "user", "parts": [{"text": "more"}]}
    later = later_turn(two, output("1"), output("2"), more)
    spliced = GEMINI_GENERATE.with_kept(later, [kept])["contents"]
    shape = [(c["role"], [next(iter(p)) for p in c["parts"]]) for c in spliced]
    assert shape == [
        ("user", ["text"]),
        ("model", ["functionCall", "functionCall"]),
        ("user", ["functionResponse"]),
        ("user", ["functionResponse"]),
        ("model", ["functionCall"]),  # the gate's: after both outputs, never between
        ("user", ["functionResponse"]),
        ("user", ["text"]),
    ]
    assert GEMINI_GENERATE.tool_outputs({**later, "contents": spliced}) == (
        GEMINI_GENERATE.tool_outputs(later)
    )
    # a new execution: right after the last user message
    fresh = GEMINI_GENERATE.with_kept(first_turn(), [kept])["contents"]
    assert [c["role"] for c in fresh] == ["user", "model", "user"]


def test_an_execution_line_numbers_a_run_that_opens_alike_apart() -> None:
    other = {
        "role": "system",
        "parts": [{"text": SYSTEM["parts"][0]["text"] + "\nloopstop-execution: 2"}],
    }
    assert ids(first_turn(), 1) != ids(first_turn(systemInstruction=other), 1)
    assert ids(first_turn(), 1) == ids(later_turn(), 1)


def test_a_follow_on_stream_s_chunks_continue_the_answer() -> None:
    reader = GEMINI_STREAM.stream_reader(first_turn())
    (first,) = reader.feed(
        frame({"candidates": [{"content": {"role": "model", "parts": [call("a")]}}]})
    )
    assert isinstance(first, Held)
    nxt = reader.follow_on(first_turn())
    text = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]}}]}
    (passed,) = nxt.feed(frame(text))
    assert isinstance(passed, Passed) and passed.chars == 2
    last = answer({"text": "!"}, usage=USAGE)
    nxt.feed(frame(last))
    final = nxt.end()
    assert final.proposals == []  # the first stream's held call is not the next one's
