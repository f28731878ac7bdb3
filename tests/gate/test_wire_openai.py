"""The model gate's wire adapters as pure tables (DESIGN §5, STYLE 18): wire samples
in, parsed parts out; every answer, chunk and event the gate writes itself is
validated against the official ``openai`` SDK's types. No app, no store, no socket."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import sseclient
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from sidecar.errors import MalformedRequest
from sidecar.gate.wire import OPENAI_CHAT, OPENAI_RESPONSES, WireAdapter
from sidecar.gate.wire.base import (
    ErrorEvent,
    Final,
    Frame,
    Framing,
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
    parse_args,
)

STAMP = Stamp(1_700_000_000, "0123456789abcdef01234567")
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
TEXT = "[loopstop] This task has ended: partial (same_call)."


def events_of(raw: list[bytes]) -> list[sseclient.Event]:
    return list(sseclient.SSEClient([b"".join(raw)]).events())


def frame(data: Any, event: str | None = None) -> Frame:
    return Frame(data if isinstance(data, str) else json.dumps(data), event)


def feed_all(reader: StreamReader, frames: list[Frame]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    for f in frames:
        out.extend(reader.feed(f))
    return out


def valid_chat_stream(raw: list[bytes]) -> list[ChatCompletionChunk]:
    """Every event a chunk the SDK accepts, then ``[DONE]`` last."""
    events = events_of(raw)
    assert events[-1].data == "[DONE]"
    return [ChatCompletionChunk.model_validate_json(e.data) for e in events[:-1]]


def valid_responses_stream(raw: list[bytes]) -> list[Any]:
    """Every event one of the SDK's Responses stream events, named by its type."""
    out = []
    for e in events_of(raw):
        parsed = STREAM_EVENT.validate_json(e.data)
        assert e.event == parsed.type
        out.append(parsed)
    return out


def sdk_error(adapter: WireAdapter, raw: bytes) -> openai.APIError:
    """What the SDK's own stream decoder raises on ``raw`` (an error event)."""
    import importlib

    httpx = importlib.import_module("httpx2" if _has("httpx2") else "httpx")
    request = httpx.Request("POST", "http://gate.invalid/v1" + adapter.path)
    response = httpx.Response(
        200, content=raw, headers={"content-type": "text/event-stream"}, request=request
    )
    client = openai.OpenAI(api_key="sk-test", base_url="http://gate.invalid/v1")
    cast_to = ChatCompletionChunk if adapter is OPENAI_CHAT else Response
    with pytest.raises(openai.APIError) as caught:
        list(openai.Stream(cast_to=cast_to, response=response, client=client))
    return caught.value


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- reading requests ------------------------------------------------------------------


CHAT_BODY = {
    "model": "gpt-5-mini",
    "messages": [
        {"role": "system", "content": "You help.\nloopstop-task-key: k-1"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "loopstop-task-key: later"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        {"role": "tool", "content": "no id: not an output the gate can match"},
    ],
    "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}},
        {"type": "function", "function": {"name": "g"}},
    ],
    "max_completion_tokens": 50,
}

RESPONSES_BODY = {
    "model": "gpt-5-mini",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "loopstop-task-key: k-1"}],
        },
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "system", "content": "loopstop-task-key: later"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
    ],
    "tools": [
        {"type": "function", "name": "f", "parameters": {}, "strict": None},
        {"type": "web_search"},
    ],
    "max_output_tokens": 40,
}


@pytest.mark.parametrize(
    ("adapter", "body", "parts"),
    [
        (
            OPENAI_CHAT,
            CHAT_BODY,
            {
                "system": ["You help.\nloopstop-task-key: k-1"],
                "outputs": [ToolOutput("call_1", "done")],
                "tools": frozenset({"f", "g"}),
                "max_output": 50,
            },
        ),
        (
            OPENAI_RESPONSES,
            RESPONSES_BODY,
            {
                "system": ["loopstop-task-key: k-1"],
                "outputs": [ToolOutput("call_1", "done")],
                "tools": frozenset({"f"}),
                "max_output": 40,
            },
        ),
        (
            OPENAI_RESPONSES,
            {"instructions": "loopstop-task: t0", "input": "hi"},
            {"system": ["loopstop-task: t0"], "outputs": [], "tools": None, "max_output": None},
        ),
        (
            OPENAI_CHAT,
            {"messages": [{"role": "user", "content": "hi"}]},
            {"system": [], "outputs": [], "tools": None, "max_output": None},
        ),
    ],
)
def test_a_request_s_parts_are_read_from_the_system_message_only(
    adapter: WireAdapter, body: dict[str, Any], parts: dict[str, Any]
) -> None:
    """The System Message is the first system/developer text (or ``instructions``):
    a later system message (here ``loopstop-task-key: later``) is not read."""
    adapter.validate(body)
    assert adapter.system_texts(body) == parts["system"]
    assert adapter.tool_outputs(body) == parts["outputs"]
    assert adapter.offered_tools(body) == parts["tools"]
    assert adapter.max_output_tokens(body) == parts["max_output"]
    assert adapter.streaming(body) is False
    assert adapter.streaming({**body, "stream": True}) is True
    assert adapter.model(body, {}) == body.get("model")


@pytest.mark.parametrize(
    ("adapter", "body", "field"),
    [
        (OPENAI_CHAT, {"messages": []}, ["messages"]),
        (OPENAI_CHAT, {"input": "hi"}, ["messages"]),
        (OPENAI_CHAT, {"messages": [{"content": "no role"}]}, ["messages", "0", "role"]),
        (OPENAI_CHAT, {"messages": [{"role": "user"}], "stream": "yes"}, ["stream"]),
        (OPENAI_CHAT, {"messages": [{"role": "user"}], "stream_options": 1}, ["stream_options"]),
        (OPENAI_RESPONSES, {"messages": [{"role": "user"}]}, ["input"]),
        (OPENAI_RESPONSES, {"input": []}, ["input"]),
        (OPENAI_RESPONSES, {"input": ""}, ["input"]),
        (OPENAI_RESPONSES, {"input": ["text"]}, ["input", "0"]),
        (OPENAI_RESPONSES, {"input": "hi", "instructions": 3}, ["instructions"]),
        (OPENAI_RESPONSES, {"input": "hi", "model": 7}, ["model"]),
    ],
)
def test_a_body_not_of_the_api_s_shape_is_refused_naming_the_field(
    adapter: WireAdapter, body: dict[str, Any], field: list[str]
) -> None:
    with pytest.raises(MalformedRequest) as caught:
        adapter.validate(body)
    assert caught.value.extra["errors"][0]["loc"] == ["body", *field]


def test_a_wrap_up_note_is_the_last_system_message_and_the_request_is_not_changed() -> None:
    chat = OPENAI_CHAT.with_wrap_up(CHAT_BODY, "Conclude now.")
    assert chat["messages"][-1] == {"role": "system", "content": "Conclude now."}
    assert len(CHAT_BODY["messages"]) == len(chat["messages"]) - 1
    resp = OPENAI_RESPONSES.with_wrap_up(RESPONSES_BODY, "Conclude now.")
    assert resp["input"][-1] == {"type": "message", "role": "system", "content": "Conclude now."}
    text = OPENAI_RESPONSES.with_wrap_up({"input": "hi"}, "Conclude now.")
    assert text["input"] == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "system", "content": "Conclude now."},
    ]


def test_the_forwarded_payload_names_the_model_and_a_chat_stream_asks_for_usage() -> None:
    body = {"messages": [{"role": "user"}], "stream": True, "stream_options": {"x": 1}}
    payload = OPENAI_CHAT.forward_payload(body, "m")
    assert payload["model"] == "m"
    assert payload["stream_options"] == {"x": 1, "include_usage": True}
    assert "stream_options" not in OPENAI_CHAT.forward_payload({"messages": []}, "")
    assert "model" not in OPENAI_RESPONSES.forward_payload({"input": "hi", "stream": True}, "")
    assert "stream_options" not in OPENAI_RESPONSES.forward_payload({"stream": True}, "m")


# -- reading answers -------------------------------------------------------------------

CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "x"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "send", "arguments": "not json"},
                    },
                ],
            },
            "finish_reason": "tool_calls",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}

RESPONSE_ANSWER = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "m",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_a",
            "name": "search",
            "arguments": '{"q": "x"}',
            "status": "completed",
        },
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 7,
        "output_tokens": 3,
        "total_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    },
}


@pytest.mark.parametrize(
    ("adapter", "answer", "proposals"),
    [
        (
            OPENAI_CHAT,
            CHAT_ANSWER,
            [Proposal("call_a", "search", {"q": "x"}), Proposal("call_b", "send", "not json")],
        ),
        (OPENAI_RESPONSES, RESPONSE_ANSWER, [Proposal("call_a", "search", {"q": "x"})]),
    ],
)
def test_an_answer_s_proposals_and_usage_are_read(
    adapter: WireAdapter, answer: dict[str, Any], proposals: list[Proposal]
) -> None:
    read = adapter.read_answer(answer)
    assert read.proposals == proposals
    assert read.usage == Usage(10, (7, 3))


@pytest.mark.parametrize(
    ("adapter", "answer"),
    [
        (OPENAI_CHAT, None),
        (OPENAI_CHAT, RESPONSE_ANSWER),
        (OPENAI_CHAT, ["choices"]),
        (OPENAI_RESPONSES, CHAT_ANSWER),
        (OPENAI_RESPONSES, "output"),
    ],
)
def test_an_answer_of_another_shape_is_not_this_api_s_answer(
    adapter: WireAdapter, answer: Any
) -> None:
    with pytest.raises(NotThisAnswer, match="not a"):
        adapter.read_answer(answer)


@pytest.mark.parametrize(
    ("adapter", "usage", "read"),
    [
        (
            OPENAI_CHAT,
            {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
            (10, (7, 3)),
        ),
        (OPENAI_CHAT, {"total_tokens": 10}, (10, None)),
        (OPENAI_CHAT, {"total_tokens": True}, (None, None)),
        (OPENAI_CHAT, {"total_tokens": -1}, (None, None)),
        (OPENAI_RESPONSES, {"input_tokens": 7, "output_tokens": 3}, (10, (7, 3))),
        (OPENAI_RESPONSES, {"input_tokens": 7, "output_tokens": None}, (None, None)),
        (OPENAI_RESPONSES, {"total_tokens": 10}, (None, None)),
        (OPENAI_RESPONSES, None, (None, None)),
        (OPENAI_RESPONSES, "10", (None, None)),
    ],
)
def test_usage_is_what_the_api_counts_and_malformed_usage_is_none(
    adapter: WireAdapter, usage: Any, read: tuple[Any, Any]
) -> None:
    assert adapter.usage(usage) == Usage(*read)


@pytest.mark.parametrize(
    ("raw", "args"),
    [
        ('{"b": 1, "a": [1.0]}', {"b": 1, "a": [1.0]}),
        ('{"q": NaN}', '{"q": NaN}'),
        ('"\\ud800"', '"\\ud800"'),
        ("\ud800", "\\ud800"),
        (None, None),
        ({"already": "parsed"}, {"already": "parsed"}),
    ],
)
def test_a_proposal_s_arguments_are_json_or_the_text_itself(raw: Any, args: Any) -> None:
    assert parse_args(raw) == args


# -- the gate's own answers, against the SDK's types -----------------------------------


def test_the_gate_s_final_answers_are_valid_sdk_objects() -> None:
    chat = ChatCompletion.model_validate(OPENAI_CHAT.final_answer(TEXT, "m", STAMP))
    assert chat.choices[0].message.content == TEXT and chat.choices[0].finish_reason == "stop"
    assert chat.created == STAMP.created and chat.id.endswith(STAMP.token)
    resp = Response.model_validate(OPENAI_RESPONSES.final_answer(TEXT, "m", STAMP))
    assert resp.output_text == TEXT and resp.status == "completed"
    assert resp.created_at == STAMP.created


def test_a_replaced_answer_keeps_the_upstream_s_fields_and_holds_only_the_text() -> None:
    chat = ChatCompletion.model_validate(OPENAI_CHAT.replace_with_text(CHAT_ANSWER, TEXT, STAMP))
    assert chat.id == "chatcmpl-1" and chat.usage is not None and chat.usage.total_tokens == 10
    assert chat.choices[0].message.tool_calls is None and chat.choices[0].message.content == TEXT
    resp = Response.model_validate(OPENAI_RESPONSES.replace_with_text(RESPONSE_ANSWER, TEXT, STAMP))
    assert resp.id == "resp_1" and [o.type for o in resp.output] == ["message"]
    assert resp.output_text == TEXT


@pytest.mark.parametrize("include_usage", [False, True])
def test_the_gate_s_chat_stream_is_valid_chunks_then_done(include_usage: bool) -> None:
    body = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = valid_chat_stream(OPENAI_CHAT.final_stream(TEXT, "m", STAMP, body))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
    assert [c.usage is not None for c in chunks] == [False, False, *([True] * include_usage)]
    assert {c.id for c in chunks} == {STAMP.id("chatcmpl-loopstop-")}


def test_the_gate_s_responses_stream_is_valid_events_in_sequence() -> None:
    events = valid_responses_stream(OPENAI_RESPONSES.final_stream(TEXT, "m", STAMP, {}))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == TEXT


@pytest.mark.parametrize("adapter", [OPENAI_CHAT, OPENAI_RESPONSES])
def test_errors_are_in_the_api_s_shape_and_the_sdk_raises_the_stream_s(
    adapter: WireAdapter,
) -> None:
    body = adapter.error_body("the upstream model took too long", "timeout")
    assert body == {
        "error": {
            "message": "the upstream model took too long",
            "type": "loopstop_gate",
            "code": "timeout",
            "param": None,
        }
    }
    relayed = {"error": {"message": "slow down", "type": "rate_limit", "code": None}}
    assert adapter.upstream_error_body(429, relayed) == relayed
    own = adapter.upstream_error_body(502, "<html>")
    assert own["error"]["message"] == "the upstream model answered 502"
    err = sdk_error(adapter, adapter.error_event("the stream broke", "upstream_stream_cut"))
    assert err.message == "the stream broke"
    assert isinstance(err.body, dict) and err.body["code"] == "upstream_stream_cut"


def test_the_model_list_is_the_upstream_s_or_the_default_model() -> None:
    listed = {"object": "list", "data": [{"id": "x"}]}
    assert OPENAI_CHAT.model_list(listed, "d") == listed
    fallback = OPENAI_CHAT.model_list({"models": []}, "d")
    assert [m["id"] for m in fallback["data"]] == ["d"]
    assert OPENAI_CHAT.framing is Framing.SSE and OPENAI_CHAT.models_path == "/models"


# -- streams -------------------------------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> Frame:
    return frame(
        {
            "id": "chatcmpl-up",
            "object": "chat.completion.chunk",
            "created": 5,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
    )


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
CHAT_STREAM = [
    _chunk({"role": "assistant", "content": "Look"}),
    _chunk({"content": "ing."}),
    _chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "search"}}
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}),
    _chunk({}, "tool_calls"),
    frame(
        {
            "id": "chatcmpl-up",
            "object": "chat.completion.chunk",
            "created": 5,
            "model": "m",
            "choices": [],
            "usage": USAGE,
        }
    ),
    frame("[DONE]"),
]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_chat_stream_passes_text_holds_the_call_and_finishes_by_the_decision(
    include_usage: bool,
) -> None:
    body = {"stream_options": {"include_usage": True}} if include_usage else {}
    reader = OPENAI_CHAT.stream_reader(body)
    events = feed_all(reader, CHAT_STREAM)
    assert [type(e) for e in events] == [Passed, Passed, Held, Held, Held, Held, Final]
    assert sum(e.chars for e in events if isinstance(e, Passed | Held)) == len("Looking.")
    final = events[-1]
    assert isinstance(final, Final)
    assert final.proposals == [Proposal("call_a", "search", {"q": "x"})]
    assert final.usage == Usage(10, (7, 3))
    held = [e for e in events if isinstance(e, Held)]
    admitted = reader.finish(held, None, STAMP)
    assert admitted[:4] == [h.raw for h in held]
    chunks = valid_chat_stream(admitted)
    assert [c.usage is not None for c in chunks] == [False] * 4 + [True] * include_usage
    replaced = valid_chat_stream(reader.finish(held, TEXT, STAMP))
    assert [c.choices[0].delta.content for c in replaced if c.choices] == [TEXT, None]
    assert [c.choices[0].finish_reason for c in replaced if c.choices] == [None, "stop"]
    assert {c.id for c in replaced} == {"chatcmpl-up"}  # the upstream's own id goes on


def test_a_chat_stream_s_usage_on_a_content_chunk_is_taken_off_it() -> None:
    reader = OPENAI_CHAT.stream_reader({})
    (passed,) = reader.feed(_chunk({"content": "hi"}, "stop", usage=USAGE))
    assert isinstance(passed, Passed) and b"usage" not in passed.raw
    assert reader.end() == Final([], Usage(10, (7, 3)))


def test_a_chat_stream_that_ends_before_its_last_chunk_is_broken() -> None:
    reader = OPENAI_CHAT.stream_reader({})
    reader.feed(_chunk({"content": "hi"}))
    with pytest.raises(StreamBroken) as caught:
        reader.feed(frame("[DONE]"))
    assert caught.value.code == "upstream_stream_cut"
    with pytest.raises(StreamBroken):
        OPENAI_CHAT.stream_reader({}).end()


@pytest.mark.parametrize("adapter", [OPENAI_CHAT, OPENAI_RESPONSES])
@pytest.mark.parametrize("data", ["not json", "[1, 2]"])
def test_an_unreadable_event_breaks_the_stream(adapter: WireAdapter, data: str) -> None:
    with pytest.raises(StreamBroken) as caught:
        adapter.stream_reader({}).feed(frame(data))
    assert caught.value.code == "bad_upstream_response"


@pytest.mark.parametrize(
    ("adapter", "error"),
    [
        (OPENAI_CHAT, frame({"error": {"message": "overloaded", "type": "server_error"}})),
        (
            OPENAI_RESPONSES,
            frame(
                {"type": "error", "code": "x", "message": "overloaded", "sequence_number": 1},
                "error",
            ),
        ),
    ],
)
def test_the_upstream_s_error_event_is_relayed_as_it_came(
    adapter: WireAdapter, error: Frame
) -> None:
    (event,) = adapter.stream_reader({}).feed(error)
    assert isinstance(event, ErrorEvent)
    assert events_of([event.raw])[0].data == error.data


def _ev(kind: str, seq: int, **fields: Any) -> Frame:
    return frame({"type": kind, "sequence_number": seq, **fields}, kind)


_CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_a",
    "name": "search",
    "arguments": "",
    "status": "in_progress",
}
_MSG = RESPONSE_ANSWER["output"][0]
_STARTED = {**RESPONSE_ANSWER, "status": "in_progress", "output": [], "usage": None}
RESPONSES_STREAM = [
    _ev("response.created", 0, response=_STARTED),
    _ev("response.output_item.added", 1, output_index=0, item={**_MSG, "content": []}),
    _ev(
        "response.output_text.delta",
        2,
        item_id="msg_1",
        output_index=0,
        content_index=0,
        delta="Looking.",
        logprobs=[],
    ),
    _ev("response.output_item.done", 3, output_index=0, item=_MSG),
    _ev("response.output_item.added", 4, output_index=1, item=_CALL),
    _ev("response.function_call_arguments.delta", 5, item_id="fc_1", output_index=1, delta='{"q":'),
    _ev(
        "response.function_call_arguments.done",
        6,
        item_id="fc_1",
        output_index=1,
        arguments='{"q": "x"}',
        name="search",
    ),
    _ev(
        "response.output_item.done",
        7,
        output_index=1,
        item={**_CALL, "arguments": '{"q": "x"}', "status": "completed"},
    ),
    _ev("response.completed", 8, response=RESPONSE_ANSWER),
]


def test_a_responses_stream_passes_text_holds_the_call_and_finishes_by_the_decision() -> None:
    valid_responses_stream(
        [f"event: {f.event}\ndata: {f.data}\n\n".encode() for f in RESPONSES_STREAM]
    )
    reader = OPENAI_RESPONSES.stream_reader({})
    events = feed_all(reader, RESPONSES_STREAM)
    assert [type(e) for e in events] == [Passed] * 4 + [Held] * 4 + [Final]
    assert sum(e.chars for e in events if isinstance(e, Passed)) == len("Looking.")
    final = events[-1]
    assert isinstance(final, Final)
    assert final.proposals == [Proposal("call_a", "search", {"q": "x"})]
    assert final.usage == Usage(10, (7, 3))
    held = [e for e in events if isinstance(e, Held)]
    admitted = valid_responses_stream(reader.finish(held, None, STAMP))
    assert [e.sequence_number for e in admitted] == [4, 5, 6, 7, 8]
    replaced = valid_responses_stream(reader.finish(held, TEXT, STAMP))
    assert [e.sequence_number for e in replaced] == list(range(9, 9 + len(replaced)))
    done = replaced[-1]
    assert done.type == "response.completed" and done.response.id == "resp_1"
    assert [o.type for o in done.response.output] == ["message", "message"]
    assert done.response.output[1].content[0].text == TEXT


def test_a_responses_stream_without_its_final_event_is_broken() -> None:
    reader = OPENAI_RESPONSES.stream_reader({})
    feed_all(reader, RESPONSES_STREAM[:3])
    with pytest.raises(StreamBroken) as caught:
        reader.end()
    assert caught.value.code == "upstream_stream_cut"
    with pytest.raises(StreamBroken) as caught:
        reader.feed(_ev("response.completed", 9, response="gone"))
    assert caught.value.code == "bad_upstream_response"


@pytest.mark.security
def test_item5_a_responses_stream_s_calls_are_its_item_events_and_the_final_output_s() -> None:
    """Attack item 5: a call streamed as item events but left out of
    ``response.completed``'s output is a proposal all the same (the client builds
    its tool calls from those events), and a call only in the final output too."""
    only_final = {"type": "function_call", "call_id": "call_b", "name": "get", "arguments": "{}"}
    completed = {**RESPONSE_ANSWER, "output": [_MSG, only_final]}
    stream = [*RESPONSES_STREAM[:-1], _ev("response.completed", 8, response=completed)]
    final = feed_all(OPENAI_RESPONSES.stream_reader({}), stream)[-1]
    assert isinstance(final, Final)
    assert final.proposals == [
        Proposal("call_a", "search", {"q": "x"}),
        Proposal("call_b", "get", {}),
    ]
    # arguments joined from the deltas when no .done event carries them
    partial = [RESPONSES_STREAM[4], RESPONSES_STREAM[5], RESPONSES_STREAM[5]]
    reader = OPENAI_RESPONSES.stream_reader({})
    feed_all(reader, partial)
    (end,) = reader.feed(_ev("response.completed", 9, response={**RESPONSE_ANSWER, "output": []}))
    assert isinstance(end, Final)
    assert end.proposals == [Proposal("call_a", "search", '{"q":{"q":')]


@pytest.mark.security
def test_item13_a_chat_chunk_with_error_null_is_an_ordinary_chunk() -> None:
    """Attack item 13: ``"error": null`` on a chunk is no error event."""
    reader = OPENAI_CHAT.stream_reader({})
    events = [
        *reader.feed(_chunk({"content": "hi"}, error=None)),
        *reader.feed(_chunk({}, "stop", error=None)),
        *reader.feed(frame("[DONE]")),
    ]
    assert [type(e) for e in events] == [Passed, Passed, Final]
    (error,) = reader.feed(_chunk({}, error={"message": "boom"}))
    assert isinstance(error, ErrorEvent)


@pytest.mark.security
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 1.7e308),
        ("max_tokens", 10**30),
        ("max_completion_tokens", 0),
        ("max_output_tokens", True),
        ("n", 1000),
    ],
)
def test_item10_an_output_limit_or_choice_count_past_any_bound_is_refused(
    field: str, value: Any
) -> None:
    """Attack item 10: numbers bounded at parse, the 400 naming the field."""
    body = {"messages": [{"role": "user", "content": "x"}], "input": "x", field: value}
    for adapter in (OPENAI_CHAT, OPENAI_RESPONSES):
        with pytest.raises(MalformedRequest) as caught:
            adapter.validate(body)
        assert caught.value.extra["errors"][0]["loc"] == ["body", field]


@pytest.mark.security
def test_item10_a_usage_count_past_any_turn_is_no_usage() -> None:
    """Attack item 10: 10^308 or 10^400 tokens is not a count (charged the reservation)."""
    for huge in (10**308, 10**400):
        assert OPENAI_CHAT.usage({"prompt_tokens": 1, "completion_tokens": huge}).split is None
        assert OPENAI_RESPONSES.usage({"input_tokens": huge, "output_tokens": 1}).tokens is None
