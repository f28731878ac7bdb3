"""The Anthropic Messages adapter as pure tables (DESIGN §5, STYLE 18): wire samples in
(what n8n 2.41.1's Anthropic Chat Model really sends, and what Anthropic answers),
parsed parts out; every answer, stream event and error the gate writes is validated
against the official ``anthropic`` SDK's types, and a whole stream is accumulated
by the SDK's own accumulator. No app, no store, no socket."""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic
import httpx2 as httpx  # what this anthropic SDK speaks HTTP with
import pytest
import sseclient
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.pagination import SyncPage
from anthropic.types import ErrorResponse, Message, ModelInfo, RawMessageStreamEvent
from pydantic import BaseModel, TypeAdapter

from sidecar.errors import MalformedRequest
from sidecar.gate.wire import ANTHROPIC_MESSAGES as A
from sidecar.gate.wire.anthropic import ANTHROPIC_API
from sidecar.gate.wire.base import (
    BEARER,
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
    TokenFrom,
    ToolOutput,
    Usage,
)

STAMP = Stamp(1_700_000_000, "0123456789abcdef01234567")
EVENT = TypeAdapter(RawMessageStreamEvent)
TEXT = "[loopstop] This task has ended: partial (same_call)."

#: n8n 2.41.1's second turn (wire facts §2.4: captured, non-streamed).
N8N_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-6",
    "stream": False,
    "max_tokens": 16384,
    "tools": [
        {
            "name": "echo",
            "description": "Echoes q back.",
            "input_schema": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        }
    ],
    "messages": [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01ABC",
                    "name": "echo",
                    "input": {"q": "a", "id": "toolu_01ABC"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "content": '[{"response":"a"}]',
                    "tool_use_id": "toolu_01ABC",
                }
            ],
        },
    ],
    "system": "You are X.\nloopstop-task-key: T-1",
}

#: What Anthropic answers (wire facts §2.5, accepted by n8n).
ANSWER: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [
        {"type": "text", "text": "Let me call echo."},
        {"type": "tool_use", "id": "toolu_01ABC", "name": "echo", "input": {"q": "a"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 11, "output_tokens": 7},
}

#: The stream n8n accepted (wire facts §2.5), as (event name, data).
STREAM: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_01",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 11, "output_tokens": 1},
            },
        },
    ),
    ("ping", {"type": "ping"}),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Let me call echo."},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_01ABC", "name": "echo", "input": {}},
        },
    ),
    *[
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": part},
            },
        )
        for part in ("", '{"q": ', '"a"}')
    ],
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 7},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]


def frames(stream: list[tuple[str, dict[str, Any]]], named: bool = True) -> list[Frame]:
    return [Frame(json.dumps(data), event if named else None) for event, data in stream]


def feed_all(reader: StreamReader, given: list[Frame]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    for f in given:
        out.extend(reader.feed(f))
    return out


def strict(model: BaseModel) -> None:
    """No member the SDK's type does not know, at any depth (a typo would pass as extra)."""
    assert not model.model_extra, model.model_extra
    for value in model.__dict__.values():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, BaseModel):
                strict(item)


def sdk_events(raw: list[bytes]) -> list[Any]:
    """Every event one of the SDK's stream events, its ``event:`` name its type
    (``ping``, which the SDK skips, only checked for its name)."""
    out = []
    for e in sseclient.SSEClient([b"".join(raw)]).events():
        if e.event == "ping":
            assert json.loads(e.data) == {"type": "ping"}
            continue
        parsed = EVENT.validate_json(e.data)
        strict(parsed)
        assert e.event == parsed.type, (e.event, parsed.type)
        out.append(parsed)
    return out


def accumulated(raw: list[bytes]) -> Message:
    """The Message the SDK's own stream accumulator builds from ``raw``."""
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for event in sdk_events(raw):
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    return snapshot


def sdk_stream_error(raw: bytes) -> anthropic.APIError:
    """What the SDK's own stream decoder raises on ``raw`` (an error event)."""
    request = httpx.Request("POST", "http://gate.invalid/v1/messages")
    response = httpx.Response(
        200, content=raw, headers={"content-type": "text/event-stream"}, request=request
    )
    client = anthropic.Anthropic(api_key="sk-test", base_url="http://gate.invalid")
    with pytest.raises(anthropic.APIError) as caught:
        list(anthropic.Stream(cast_to=RawMessageStreamEvent, response=response, client=client))
    return caught.value


# -- the API: its upstream, its key header, where the token is read -------------------------------


def test_the_api_is_reached_with_x_api_key_and_its_version_headers() -> None:
    assert A.api is ANTHROPIC_API
    assert ANTHROPIC_API.name == "anthropic"
    assert (ANTHROPIC_API.key_header, ANTHROPIC_API.key_prefix) == ("x-api-key", "")
    assert ANTHROPIC_API.pass_headers == ("anthropic-version", "anthropic-beta")
    assert dict(ANTHROPIC_API.default_headers) == {"anthropic-version": "2023-06-01"}
    assert ANTHROPIC_API.token_from == (TokenFrom("x-api-key"), BEARER)
    assert (A.path, A.models_path) == ("/v1/messages", "/v1/models")


# -- reading requests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system", "texts"),
    [
        ("You are X.\nloopstop-task-key: T-1", ["You are X.\nloopstop-task-key: T-1"]),
        (
            [
                {"type": "text", "text": "You are X."},
                {"type": "text", "text": "loopstop-task: t0123", "cache_control": {"type": "x"}},
                {"type": "image", "source": {}},
            ],
            ["You are X.", "loopstop-task: t0123"],
        ),
        (None, []),
        ([], []),
    ],
)
def test_the_system_message_is_system(system: Any, texts: list[str]) -> None:
    body = {**N8N_BODY, "system": system}
    if system is None:
        del body["system"]
    assert A.system_texts(body) == texts


def test_a_system_role_in_messages_is_not_the_system_message() -> None:
    body = {**N8N_BODY, "messages": [{"role": "system", "content": "loopstop-task-key: x"}]}
    del body["system"]
    assert A.system_texts(body) == []


def test_tool_outputs_are_the_tool_result_blocks_of_user_messages() -> None:
    assert A.tool_outputs(N8N_BODY) == [ToolOutput("toolu_01ABC", '[{"response":"a"}]')]
    # parallel calls, as n8n sends them back: one assistant/user pair per call
    pairs = [
        m
        for call, out in (("toolu_A", "[1]"), ("toolu_B", "[2]"))
        for m in (
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call, "name": "echo", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": out}],
            },
        )
    ]
    merged = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_C", "content": [{"type": "text"}]},
            {"type": "text", "text": "and"},
            {"type": "tool_result", "content": "no id: nothing to match"},
        ],
    }
    assistant_claims = {
        "role": "assistant",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_X", "content": "forged"}],
    }
    body = {**N8N_BODY, "messages": [N8N_BODY["messages"][0], *pairs, merged, assistant_claims]}
    assert A.tool_outputs(body) == [
        ToolOutput("toolu_A", "[1]"),
        ToolOutput("toolu_B", "[2]"),
        ToolOutput("toolu_C", [{"type": "text"}]),
    ]


@pytest.mark.parametrize(
    ("tools", "offered"),
    [
        (N8N_BODY["tools"], frozenset({"echo"})),
        (
            [
                {"name": "a", "input_schema": {}},
                {"type": "custom", "name": "b", "input_schema": {}},
                {"type": "web_search_20250305", "name": "web_search"},
                {"type": "bash_20250124", "name": "bash"},
                {"name": 7},
                "not a tool",
            ],
            frozenset({"a", "b"}),
        ),
        ([], frozenset()),
        (None, None),
    ],
)
def test_offered_tools_are_exactly_the_client_tools(
    tools: Any, offered: frozenset[str] | None
) -> None:
    body = {**N8N_BODY, "tools": tools}
    if tools is None:
        del body["tools"]
    assert A.offered_tools(body) == offered


def test_model_stream_and_output_limit() -> None:
    assert A.model(N8N_BODY, {}) == "claude-sonnet-4-6"
    assert A.model({**N8N_BODY, "model": ""}, {}) is None
    assert A.streaming(N8N_BODY) is False and A.streaming({**N8N_BODY, "stream": True})
    assert A.max_output_tokens(N8N_BODY) == 16384
    assert A.max_output_tokens({**N8N_BODY, "max_tokens": True}) is None
    assert A.max_output_tokens({"messages": []}) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"system": 3}, "system"),
        ({"system": ["text"]}, "system"),
        ({"stream": "yes"}, "stream"),
        ({"model": 7}, "model"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_tokens": False}, "max_tokens"),
        ({"tools": {"name": "echo"}}, "tools"),
    ],
)
def test_a_body_not_of_the_api_s_shape_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        A.validate({**N8N_BODY, **change})
    assert caught.value.extra["errors"][0]["loc"] == ["body", *field.split(".")]


def test_n8n_s_bodies_are_valid() -> None:
    A.validate(N8N_BODY)
    A.validate({**N8N_BODY, "stream": True, "system": [{"type": "text", "text": "x"}]})
    A.validate({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})


# -- reading answers ----------------------------------------------------------------------------


def test_an_answer_s_tool_use_blocks_are_its_proposals() -> None:
    read = A.read_answer(ANSWER)
    assert read.proposals == [Proposal("toolu_01ABC", "echo", {"q": "a"})]
    assert read.usage == Usage(18, (11, 7))
    smallest = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    assert A.read_answer(smallest).proposals == [] and A.read_answer(smallest).usage == Usage()
    two = {
        **ANSWER,
        "content": [
            {"type": "tool_use", "id": "t1", "name": "a", "input": {"x": 1}},
            {"type": "thinking", "thinking": "...", "signature": "s"},
            {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
            {"type": "tool_use", "id": "t2", "name": "b"},
        ],
    }
    assert A.read_answer(two).proposals == [
        Proposal("t1", "a", {"x": 1}),
        Proposal("t2", "b", None),
    ]


@pytest.mark.parametrize(
    "answer",
    [None, [], "text", {"type": "error", "error": {}}, {"type": "message"}, {"content": "x"}],
)
def test_what_is_not_a_message_is_not_this_answer(answer: Any) -> None:
    with pytest.raises(NotThisAnswer):
        A.read_answer(answer)


@pytest.mark.parametrize(
    ("usage", "read"),
    [
        ({"input_tokens": 11, "output_tokens": 7}, Usage(18, (11, 7))),
        (
            {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 100},
            Usage(5, (3, 2)),
        ),
        ({"input_tokens": 11}, Usage()),
        ({"input_tokens": -1, "output_tokens": 7}, Usage()),
        ({"input_tokens": True, "output_tokens": 7}, Usage()),
        ({"input_tokens": "11", "output_tokens": 7}, Usage()),
        (None, Usage()),
        ([11, 7], Usage()),
    ],
)
def test_usage_is_input_plus_output_tokens(usage: Any, read: Usage) -> None:
    assert A.usage(usage) == read


# -- the wrap-up note ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system", "after"),
    [
        ("You are X.", "You are X.\n\nNOTE"),
        (
            [{"type": "text", "text": "You are X."}],
            [{"type": "text", "text": "You are X."}, {"type": "text", "text": "NOTE"}],
        ),
        (None, "NOTE"),
    ],
)
def test_the_wrap_up_note_is_appended_to_system(system: Any, after: Any) -> None:
    body = copy.deepcopy({**N8N_BODY, "system": system})
    if system is None:
        del body["system"]
    before = copy.deepcopy(body)
    out = A.with_wrap_up(body, "NOTE")
    assert out["system"] == after
    assert out["messages"] == body["messages"]
    assert body == before  # the request itself is unchanged
    A.validate(out)


def test_the_forwarded_payload_is_the_body_with_its_model() -> None:
    assert A.forward_payload(N8N_BODY, "claude-x") == {**N8N_BODY, "model": "claude-x"}
    assert A.forward_payload(N8N_BODY, "") == N8N_BODY


# -- streams --------------------------------------------------------------------------------------


def test_a_stream_passes_text_holds_the_tool_use_and_reads_its_usage() -> None:
    reader = A.stream_reader(N8N_BODY)
    events = feed_all(reader, frames(STREAM))
    kinds = [type(e).__name__ for e in events]
    # message_start, ping, the text block (3) pass; the tool_use block (5) is held;
    # message_delta is kept for the end; message_stop is the Final
    assert kinds == ["Passed"] * 5 + ["Held"] * 5 + ["Final"]
    assert sum(e.chars for e in events if isinstance(e, Passed)) == len("Let me call echo.")
    final = events[-1]
    assert isinstance(final, Final)
    assert final.proposals == [Proposal("toolu_01ABC", "echo", {"q": "a"})]
    # input_tokens from message_start, plus the last (cumulative) output_tokens: 11 + 7
    assert final.usage == Usage(18, (11, 7))
    held = [e for e in events if isinstance(e, Held)]
    passed = [e.raw for e in events if isinstance(e, Passed)]
    relayed = accumulated([*passed, *reader.finish(held, None, STAMP)])
    assert [b.type for b in relayed.content] == ["text", "tool_use"]
    assert relayed.content[1].input == {"q": "a"}  # type: ignore[union-attr]
    assert relayed.stop_reason == "tool_use" and relayed.usage.output_tokens == 7


def test_a_denied_proposal_s_stream_ends_with_the_gate_s_text_in_its_place() -> None:
    reader = A.stream_reader(N8N_BODY)
    events = feed_all(reader, frames(STREAM))
    held = [e for e in events if isinstance(e, Held)]
    passed = [e.raw for e in events if isinstance(e, Passed)]
    out = reader.finish(held, TEXT, STAMP)
    message = accumulated([*passed, *out])
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "Let me call echo."),
        ("text", TEXT),
    ]
    assert message.stop_reason == "end_turn"
    assert b"toolu_01ABC" not in b"".join(out)


def test_everything_after_the_first_tool_use_block_is_held_in_order() -> None:
    late_text = [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "text_delta", "text": "ok"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    ]
    stream = [*STREAM[:-2], *late_text, *STREAM[-2:]]
    reader = A.stream_reader(N8N_BODY)
    events = feed_all(reader, frames(stream))
    assert [type(e).__name__ for e in events] == ["Passed"] * 5 + ["Held"] * 8 + ["Final"]
    held = [e for e in events if isinstance(e, Held)]
    passed = [e.raw for e in events if isinstance(e, Passed)]
    relayed = accumulated([*passed, *reader.finish(held, None, STAMP)])
    assert [b.type for b in relayed.content] == ["text", "tool_use", "text"]
    denied = accumulated([*passed, *reader.finish(held, TEXT, STAMP)])
    assert [b.type for b in denied.content] == ["text", "text"]


def test_two_tool_use_blocks_are_two_proposals_in_order() -> None:
    second = [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_2", "name": "f", "input": {}},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    ]
    stream = [*STREAM[:-2], *second, *STREAM[-2:]]
    events = feed_all(A.stream_reader(N8N_BODY), frames(stream))
    final = events[-1]
    assert isinstance(final, Final)
    assert final.proposals == [
        Proposal("toolu_01ABC", "echo", {"q": "a"}),
        Proposal("toolu_2", "f", {}),  # no input_json_delta: an empty input
    ]


def test_a_stream_without_event_lines_is_relayed_with_them() -> None:
    reader = A.stream_reader(N8N_BODY)
    events = feed_all(reader, frames(STREAM, named=False))
    passed = [e.raw for e in events if isinstance(e, Passed)]
    held = [e for e in events if isinstance(e, Held)]
    assert len(accumulated([*passed, *reader.finish(held, None, STAMP)]).content) == 2


def test_an_error_event_is_relayed_and_a_cut_stream_is_broken() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    reader = A.stream_reader(N8N_BODY)
    events = feed_all(reader, [*frames(STREAM[:3]), Frame(json.dumps(error), "error")])
    assert isinstance(events[-1], ErrorEvent)
    assert "Overloaded" in str(sdk_stream_error(events[-1].raw))
    reader = A.stream_reader(N8N_BODY)
    feed_all(reader, frames(STREAM[:-1]))  # no message_stop
    with pytest.raises(StreamBroken) as cut:
        reader.end()
    assert cut.value.code == "upstream_stream_cut"
    with pytest.raises(StreamBroken):
        A.stream_reader(N8N_BODY).feed(Frame("{not json", "message_start"))


def test_odd_input_json_is_fingerprinted_never_an_error() -> None:
    odd = [
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"q": NaN'},
            },
        )
    ]
    stream = [*STREAM[:6], *odd, *STREAM[-3:]]
    final = feed_all(A.stream_reader(N8N_BODY), frames(stream))[-1]
    assert isinstance(final, Final) and final.proposals[0].args == '{"q": NaN'


# -- what the gate writes itself ------------------------------------------------------------------


def test_the_gate_s_final_answer_is_a_message_the_sdk_reads() -> None:
    body = A.final_answer(TEXT, "claude-sonnet-4-6", STAMP)
    message = Message.model_validate(body)
    strict(message)
    assert message.content[0].type == "text" and message.content[0].text == TEXT
    assert message.stop_reason == "end_turn" and message.id == "msg_loopstop" + STAMP.token
    assert A.read_answer(body).proposals == []


def test_the_gate_s_final_stream_is_one_the_sdk_accumulates() -> None:
    raw = A.final_stream(TEXT, "claude-sonnet-4-6", STAMP, N8N_BODY)
    names = [e.type for e in sdk_events(raw)]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = accumulated(raw)
    assert message.content[0].text == TEXT and message.stop_reason == "end_turn"  # type: ignore[union-attr]
    # the gate's own stream read back by the adapter: no proposal
    reader = A.stream_reader(N8N_BODY)
    got = []
    for e in sseclient.SSEClient([b"".join(raw)]).events():
        got.extend(reader.feed(Frame(e.data, e.event)))
    assert isinstance(got[-1], Final) and got[-1].proposals == []


def test_a_replaced_answer_keeps_its_id_and_usage() -> None:
    out = A.replace_with_text(ANSWER, TEXT, STAMP)
    message = Message.model_validate(out)
    strict(message)
    assert [b.type for b in message.content] == ["text"] and message.stop_reason == "end_turn"
    assert message.id == "msg_01" and message.usage.output_tokens == 7
    assert A.read_answer(out).proposals == []


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("timeout", "timeout_error"),
        ("upstream_unreachable", "api_error"),
        ("bad_upstream_response", "api_error"),
        ("upstream_stream_cut", "api_error"),
    ],
)
def test_the_gate_s_errors_are_anthropic_errors(code: str, kind: str) -> None:
    body = A.error_body("the upstream model did not answer in time", code)
    parsed = ErrorResponse.model_validate(body)
    strict(parsed)
    assert parsed.error.type == kind and parsed.error.message.startswith("the upstream")
    raised = sdk_stream_error(A.error_event("the stream broke", code))
    assert "the stream broke" in str(raised)


@pytest.mark.parametrize(
    ("status", "answer", "kind"),
    [
        (
            429,
            {
                "type": "error",
                "error": {"type": "rate_limit_error", "message": "slow down"},
                "request_id": "req_1",
            },
            "rate_limit_error",
        ),
        (529, None, "overloaded_error"),
        (429, {"error": {"message": "openai-style"}}, "rate_limit_error"),
        (401, "not json", "authentication_error"),
        (400, None, "invalid_request_error"),
        (413, None, "invalid_request_error"),
        (500, [], "api_error"),
        (502, None, "api_error"),
    ],
)
def test_an_upstream_error_is_relayed_in_anthropic_s_shape(
    status: int, answer: Any, kind: str
) -> None:
    body = A.upstream_error_body(status, answer)
    parsed = ErrorResponse.model_validate(body)
    strict(parsed)
    assert parsed.error.type == kind
    if isinstance(answer, dict) and answer.get("type") == "error":
        assert body == answer  # the upstream's own body, as it came
    else:
        assert str(status) in parsed.error.message


def test_the_model_list_is_the_upstream_s_or_the_default_model() -> None:
    listed = {
        "data": [
            {
                "type": "model",
                "id": "claude-sonnet-4-6",
                "display_name": "Claude Sonnet 4.6",
                "created_at": "2026-01-01T00:00:00Z",
                "lifecycle": "active",
            }
        ],
        "has_more": False,
        "first_id": "claude-sonnet-4-6",
        "last_id": "claude-sonnet-4-6",
    }
    assert A.model_list(listed, "x") is listed
    for upstream in (None, {"object": "list"}, []):
        page = SyncPage[ModelInfo].model_validate(A.model_list(upstream, "claude-default"))
        assert [m.id for m in page.data] == ["claude-default"]
        strict(page.data[0])


# -- the gate's own exchanges (DESIGN §5.1) ---------------------------------------------------

WRITE = Proposal("toolu_01W_g0a1b2c3d", "create_lead", {"email": "a@b.c"})
RECEIPT = '{"id":"lead-1"}'


def _request(messages: list[dict[str, Any]]) -> Any:
    """``messages`` as the SDK's request type reads them (every block a known block)."""
    from anthropic.types import MessageParam

    return [TypeAdapter(MessageParam).validate_python(m) for m in messages]


def test_an_exchange_is_a_tool_use_then_its_tool_result_in_the_next_message() -> None:
    out = A.with_exchange(N8N_BODY, WRITE, RECEIPT)
    assert out["messages"][:3] == N8N_BODY["messages"]
    assert out["messages"][3:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01W_g0a1b2c3d",
                    "name": "create_lead",
                    "input": {"email": "a@b.c"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01W_g0a1b2c3d", "content": RECEIPT}
            ],
        },
    ]
    _request(out["messages"])
    assert [m["role"] for m in out["messages"]] == ["user", "assistant"] * 2 + ["user"]
    # arguments that are not an object (text the model wrote) are no input the API takes
    odd = A.with_exchange(N8N_BODY, Proposal("toolu_x_g0a1b2c3d", "t", "not json"), "r")
    assert odd["messages"][3]["content"][0]["input"] == {}


@pytest.mark.parametrize(
    ("message", "anchor", "user"),
    [
        ({"role": "user", "content": "hi"}, "user", True),
        ({"role": "user", "content": [{"type": "text", "text": "hi"}]}, "user", True),
        (N8N_BODY["messages"][2], "output:toolu_01ABC", False),
        (
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                    {"type": "tool_result", "tool_use_id": "b", "content": "2"},
                ],
            },
            "output:b",
            False,
        ),
        (N8N_BODY["messages"][1], None, False),
        ("not a message", None, False),
    ],
)
def test_an_exchange_follows_a_user_message_only(message: Any, anchor: Any, user: bool) -> None:
    """Anchors stand on user messages (after the last tool_result of parallel
    calls): an exchange never goes between a tool_use and its tool_result."""
    from sidecar.core.gate_writes import user_anchor

    expected = user_anchor("hi") if anchor == "user" else anchor
    assert A.item_anchor(message) == expected
    assert A.is_user_message(message) is user


def test_a_kept_exchange_goes_back_after_the_message_before_it() -> None:
    from sidecar.core.gate_writes import KeptExchange

    kept = KeptExchange(
        A.last_anchor(N8N_BODY), WRITE.call_id, "create_lead", WRITE.args, RECEIPT, "replay", "o", 0
    )
    assert kept.anchor == "output:toolu_01ABC"
    later = {
        **N8N_BODY,
        "messages": [*N8N_BODY["messages"], {"role": "assistant", "content": "done"}],
    }
    spliced = A.with_kept(later, [kept])["messages"]
    assert [m["role"] for m in spliced] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert spliced[3]["content"][0]["id"] == WRITE.call_id
    _request(spliced)
    # a new execution: right after the last user message (no tool_result is one)
    fresh = A.with_kept({**N8N_BODY, "messages": [{"role": "user", "content": "hi"}]}, [kept])
    assert [m["role"] for m in fresh["messages"]] == ["user", "assistant", "user"]


def test_a_follow_on_stream_continues_the_one_message_the_agent_reads() -> None:
    """The gate answered the tool_use itself and asked again: the second stream
    has no message_start of its own, its blocks come after the text already
    passed (the held tool_use was never sent), and the SDK reads one Message."""
    first = A.stream_reader(N8N_BODY)
    events = feed_all(first, frames(STREAM))
    passed = [e.raw for e in events if isinstance(e, Passed)]
    asked = A.with_exchange(N8N_BODY, WRITE, RECEIPT)
    nxt = first.follow_on(asked)
    answer = [
        STREAM[0],
        ("content_block_start", STREAM[2][1]),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Done."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 4},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    more = feed_all(nxt, frames(answer))
    assert [type(e).__name__ for e in more] == ["Passed"] * 3 + ["Final"]
    final = more[-1]
    assert isinstance(final, Final) and final.proposals == []
    assert final.usage == Usage(15, (11, 4))  # this turn's own usage
    out = [*passed, *(e.raw for e in more if isinstance(e, Passed)), *nxt.finish([], None, STAMP)]
    assert b"toolu_01ABC" not in b"".join(out)
    message = accumulated(out)
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "Let me call echo."),
        ("text", "Done."),
    ]
    assert message.stop_reason == "end_turn"
    # asked again and answered with the gate's text: it stands after the blocks passed
    again = first.follow_on(asked)
    feed_all(again, frames(STREAM))
    last = again.finish([], TEXT, STAMP)
    index = json.loads(last[0].decode().split("data: ", 1)[1])["index"]
    assert index == 2  # after the first stream's text (0) and this one's (1), where its call began
