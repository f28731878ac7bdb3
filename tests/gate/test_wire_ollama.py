"""The Ollama wire adapter as pure tables (DESIGN §5, STYLE 18): wire samples in
(the requests n8n 2.41.1's Ollama Chat Model sends, captured), parts out; every
answer and stream line the gate writes itself is validated against the official
``ollama`` SDK's types. The Azure OpenAI adapters (OpenAI's formats behind Azure's
paths and key header) against the ``openai`` SDK's. No app, no store, no socket."""

from __future__ import annotations

import json
from typing import Any

import ollama
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from sidecar.auth import presented_token
from sidecar.errors import MalformedRequest
from sidecar.gate.wire import AZURE_CHAT, AZURE_RESPONSES, OLLAMA, WireAdapter
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
    ToolOutput,
    Usage,
)
from sidecar.gate.wire.ollama import call_id

STAMP = Stamp(1_700_000_000, "0123456789abcdef01234567")
TEXT = "[loopstop] This task has ended: partial (same_call)."
SYSTEM = "You are X.\nloopstop-task-key: T-1"
ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echoes q back.",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    },
}
OPENING = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]


def first_request(**extra: Any) -> dict[str, Any]:
    """n8n's first turn: the System Message, the user's text, the tools, ``stream: true``."""
    return {"model": "llama3.2", "options": {}, "tools": [ECHO_TOOL], "messages": OPENING, **extra}


def echoed(call_uuid: str, q: str, name: str = "echo") -> dict[str, Any]:
    """n8n's echo of an earlier call: LangChain's uuid as its id, and in its arguments."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_uuid,
                "type": "function",
                "function": {"name": name, "arguments": {"q": q, "id": call_uuid}},
            }
        ],
    }


def tool(content: str, **extra: Any) -> dict[str, Any]:
    """n8n's tool message: only ``content`` (no id, no name)."""
    return {"role": "tool", "content": content, **extra}


def lines_of(raw: list[bytes]) -> list[ollama.ChatResponse]:
    """Every line one the SDK reads as a ChatResponse, the last one ``done``."""
    text = b"".join(raw).decode()
    assert text.endswith("\n")
    parsed = [ollama.ChatResponse.model_validate_json(x) for x in text.splitlines()]
    assert [p.done for p in parsed] == [False] * (len(parsed) - 1) + [True]
    return parsed


def frame(data: dict[str, Any]) -> Frame:
    return Frame(json.dumps(data))


# -- reading requests ------------------------------------------------------------------


def test_a_request_s_parts_are_read_from_n8n_s_body() -> None:
    """The captured second turn of n8n's Ollama node (DESIGN §5; wire facts §4.4)."""
    body = first_request(
        stream=True,
        messages=[*OPENING, echoed("a13cf06c-uuid", "a"), tool('[{"response":"a"}]')],
    )
    OLLAMA.validate(body)
    assert OLLAMA.system_texts(body) == [SYSTEM]
    first = OLLAMA.number_calls(first_request(), [Proposal("", "echo", {"q": "a"})])
    assert OLLAMA.tool_outputs(body) == [ToolOutput(first[0].call_id, '[{"response":"a"}]')]
    assert OLLAMA.offered_tools(body) == frozenset({"echo"})
    assert OLLAMA.model(body, {}) == "llama3.2"
    assert OLLAMA.max_output_tokens(body) is None
    assert OLLAMA.max_output_tokens({**body, "options": {"num_predict": 64}}) == 64
    assert OLLAMA.max_output_tokens({**body, "options": {"num_predict": -1}}) is None


@pytest.mark.parametrize(
    ("body", "streams"),
    [({}, True), ({"stream": True}, True), ({"stream": False}, False)],
)
def test_a_request_streams_unless_it_says_stream_false(body: dict[str, Any], streams: bool) -> None:
    assert OLLAMA.streaming(first_request(**body)) is streams


@pytest.mark.parametrize(
    ("tools", "offered"),
    [
        ([ECHO_TOOL, {"type": "function", "function": {"name": "add_note"}}], {"echo", "add_note"}),
        ([{"type": "function", "function": {"parameters": {}}}, "echo", 3], set()),
        ([], set()),
        (None, None),
        ({"echo": ECHO_TOOL}, None),
    ],
)
def test_the_offered_tools_are_exactly_the_named_functions(tools: Any, offered: Any) -> None:
    body = {**first_request(), "tools": tools}
    assert OLLAMA.offered_tools(body) == (None if offered is None else frozenset(offered))


def test_the_system_message_is_the_first_system_message_only() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "loopstop-task-key: k-1"},
            {"role": "system", "content": "loopstop-task-key: later"},
        ]
    }
    assert OLLAMA.system_texts(body) == ["loopstop-task-key: k-1"]
    assert OLLAMA.system_texts({"messages": [{"role": "user", "content": "hi"}]}) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, ["messages"]),
        ({"prompt": "hi"}, ["messages"]),
        ({"messages": ["hi"]}, ["messages", "0", "role"]),
        ({"messages": [{"content": "no role"}]}, ["messages", "0", "role"]),
        ({"messages": [{"role": "user"}], "stream": "yes"}, ["stream"]),
        ({"messages": [{"role": "user"}], "model": 3}, ["model"]),
        ({"messages": [{"role": "user"}], "options": []}, ["options"]),
    ],
)
def test_a_body_not_of_the_api_s_shape_is_refused_naming_the_field(
    body: dict[str, Any], field: list[str]
) -> None:
    with pytest.raises(MalformedRequest) as caught:
        OLLAMA.validate(body)
    assert caught.value.extra["errors"][0]["loc"] == ["body", *field]


# -- call ids by position --------------------------------------------------------------


def ids(body: dict[str, Any], *tools: str) -> list[str]:
    """The ids the adapter gives the calls an answer to ``body`` proposes."""
    return [p.call_id for p in OLLAMA.number_calls(body, [Proposal("", t, {}) for t in tools])]


def test_a_call_s_id_is_the_same_when_its_output_comes_back_turn_after_turn() -> None:
    """Turn 1 proposes A; turn 2 carries A's output back (n8n's echo, with its own
    uuid) and proposes B; turn 3 carries both back."""
    (a,) = ids(first_request(), "echo")
    second = first_request(messages=[*OPENING, echoed("uuid-1", "a"), tool("out a")])
    assert OLLAMA.tool_outputs(second) == [ToolOutput(a, "out a")]
    (b,) = ids(second, "echo")
    assert b != a
    third = first_request(messages=[*second["messages"], echoed("uuid-2", "b"), tool("out b")])
    assert OLLAMA.tool_outputs(third) == [ToolOutput(a, "out a"), ToolOutput(b, "out b")]


def test_parallel_calls_split_by_n8n_or_kept_together_match_by_position() -> None:
    a, b = ids(first_request(), "echo", "add_note")
    split = [echoed("u1", "a"), tool("out a"), echoed("u2", "b", "add_note"), tool("out b")]
    together = [
        {"role": "assistant", "content": "", "tool_calls": [*echoed("u1", "a")["tool_calls"]]},
        tool("out a"),
        tool("out b"),
    ]
    together[0]["tool_calls"].append(echoed("u2", "b", "add_note")["tool_calls"][0])
    for history in (split, together):
        body = first_request(messages=[*OPENING, *history])
        assert OLLAMA.tool_outputs(body) == [ToolOutput(a, "out a"), ToolOutput(b, "out b")]
        assert ids(body, "echo") == [call_id(a.split("_")[1], 2)]


def test_a_tool_message_naming_its_tool_answers_that_call_and_a_stray_one_answers_none() -> None:
    a, b = ids(first_request(), "echo", "add_note")
    calls = echoed("u1", "a")["tool_calls"] + echoed("u2", "b", "add_note")["tool_calls"]
    history = [
        tool("before any call"),
        {"role": "assistant", "content": "", "tool_calls": calls},
        tool("out b", tool_name="add_note"),
        tool("unknown", tool_name="other"),
        tool("out a"),
        tool("one too many"),
    ]
    body = first_request(messages=[*OPENING, *history])
    assert OLLAMA.tool_outputs(body) == [ToolOutput(b, "out b"), ToolOutput(a, "out a")]


def test_conversations_with_other_openings_do_not_share_ids() -> None:
    other = [*OPENING[:1], {"role": "user", "content": "another question"}]
    assert ids(first_request(), "echo") != ids(first_request(messages=other), "echo")
    # the tools, the model and the options are not the conversation
    assert ids(first_request(), "echo") == ids(first_request(tools=[], model="m"), "echo")


# -- reading answers -------------------------------------------------------------------

ANSWER = {
    "model": "llama3.2",
    "created_at": "2025-01-01T00:00:00.000Z",
    "message": {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": "echo", "arguments": {"q": "a"}}},
            {"id": "ignored", "function": {"name": "send", "arguments": "not an object"}},
        ],
    },
    "done": True,
    "done_reason": "stop",
    "total_duration": 1000,
    "prompt_eval_count": 11,
    "eval_count": 7,
}


def test_an_answer_s_proposals_and_usage_are_read() -> None:
    ollama.ChatResponse.model_validate({**ANSWER, "message": {"role": "assistant"}})
    read = OLLAMA.read_answer(ANSWER)
    assert read.proposals == [
        Proposal("", "echo", {"q": "a"}),
        Proposal("", "send", "not an object"),
    ]
    assert read.usage == Usage(18, (11, 7))


@pytest.mark.parametrize("answer", [None, "done", {"done": True}, {"message": "hi"}, [ANSWER]])
def test_an_answer_of_another_shape_is_not_an_ollama_chat(answer: Any) -> None:
    with pytest.raises(NotThisAnswer, match="not an Ollama chat"):
        OLLAMA.read_answer(answer)


@pytest.mark.parametrize(
    ("usage", "read"),
    [
        ({"prompt_eval_count": 11, "eval_count": 7}, (18, (11, 7))),
        ({"eval_count": 7}, (7, (0, 7))),  # Ollama leaves out a zero (a cached prompt)
        ({"prompt_eval_count": 0, "eval_count": 0}, (0, (0, 0))),
        ({}, (None, None)),
        ({"prompt_eval_count": 11, "eval_count": -1}, (None, None)),
        ({"prompt_eval_count": True, "eval_count": 7}, (None, None)),
        ({"prompt_eval_count": "11"}, (None, None)),
        (None, (None, None)),
    ],
)
def test_usage_is_prompt_eval_count_plus_eval_count(usage: Any, read: tuple[Any, Any]) -> None:
    assert OLLAMA.usage(usage) == Usage(*read)


# -- the gate's own answers, against the SDK's types -----------------------------------


def test_the_gate_s_final_answer_is_a_done_chat_response() -> None:
    answer = ollama.ChatResponse.model_validate(OLLAMA.final_answer(TEXT, "llama3.2", STAMP))
    assert answer.done and answer.done_reason == "stop" and answer.model == "llama3.2"
    assert answer.message.role == "assistant" and answer.message.content == TEXT
    assert not answer.message.tool_calls
    assert answer.created_at == "2023-11-14T22:13:20Z"
    assert (answer.prompt_eval_count, answer.eval_count) == (0, 0)


def test_the_gate_s_stream_is_a_text_line_then_the_done_line_with_the_counts_only() -> None:
    raw = OLLAMA.final_stream(TEXT, "llama3.2", STAMP, {})
    text, done = lines_of(raw)
    assert text.message.content == TEXT and done.message.content == ""
    assert text.prompt_eval_count is None and text.eval_count is None
    assert (done.prompt_eval_count, done.eval_count) == (0, 0)


def test_a_replaced_answer_keeps_the_upstream_s_fields_and_holds_only_the_text() -> None:
    answer = ollama.ChatResponse.model_validate(OLLAMA.replace_with_text(ANSWER, TEXT, STAMP))
    assert answer.message.content == TEXT and not answer.message.tool_calls
    assert (answer.prompt_eval_count, answer.eval_count, answer.done) == (11, 7, True)


def test_a_wrap_up_note_is_the_last_system_message_and_the_request_is_not_changed() -> None:
    body = first_request()
    out = OLLAMA.with_wrap_up(body, "Conclude now.")
    assert out["messages"][-1] == {"role": "system", "content": "Conclude now."}
    assert body["messages"] == OPENING
    assert OLLAMA.forward_payload(body, "m")["model"] == "m"
    assert OLLAMA.forward_payload({"messages": []}, "") == {"messages": []}


def test_errors_are_ollama_s_error_object_and_the_sdk_reads_their_message() -> None:
    body = OLLAMA.error_body("the upstream model took too long", "timeout")
    assert body == {"error": "the upstream model took too long"}
    assert ollama.ResponseError(json.dumps(body), 504).error == body["error"]
    assert OLLAMA.upstream_error_body(429, {"error": "slow down"}) == {"error": "slow down"}
    own = OLLAMA.upstream_error_body(502, {"error": {"message": "not Ollama's"}})
    assert own == {"error": "the upstream model answered 502"}
    event = OLLAMA.error_event("the stream broke", "upstream_stream_cut")
    assert event.endswith(b"\n") and json.loads(event) == {"error": "the stream broke"}


def test_the_model_list_is_the_upstream_s_or_the_default_model() -> None:
    listed = {"models": [{"name": "llama3.2:latest", "model": "llama3.2:latest"}]}
    assert OLLAMA.model_list(listed, "d") == listed
    fallback = OLLAMA.model_list({"data": []}, "d")
    assert [m.model for m in ollama.ListResponse.model_validate(fallback).models] == ["d"]
    assert [m["name"] for m in fallback["models"]] == ["d"]  # what n8n's picker reads
    assert OLLAMA.framing is Framing.NDJSON and OLLAMA.models_path == "/api/tags"
    assert OLLAMA.path == "/api/chat"


# -- streams -------------------------------------------------------------------------


def _line(message: dict[str, Any], done: bool = False, **extra: Any) -> Frame:
    head = {"model": "llama3.2", "created_at": "2025-01-01T00:00:00.000Z"}
    return frame({**head, "message": {"role": "assistant", **message}, "done": done, **extra})


COUNTS = {"prompt_eval_count": 11, "eval_count": 7, "total_duration": 1000}
CALL = {"function": {"name": "echo", "arguments": {"q": "a"}}}
STREAM = [
    _line({"content": "Look"}),
    _line({"content": "ing."}),
    _line({"content": "", "tool_calls": [CALL]}),
    _line({"content": ""}, True, done_reason="stop", **COUNTS),
]


def test_a_stream_passes_text_holds_the_calls_and_finishes_by_the_decision() -> None:
    reader = OLLAMA.stream_reader({})
    events = [e for f in STREAM for e in reader.feed(f)]
    assert [type(e) for e in events] == [Passed, Passed, Held, Final]
    assert sum(e.chars for e in events if isinstance(e, Passed | Held)) == len("Looking.")
    final = events[-1]
    assert final == Final([Proposal("", "echo", {"q": "a"})], Usage(18, (11, 7)))
    held = [e for e in events if isinstance(e, Held)]
    admitted = reader.finish(held, None, STAMP)
    assert admitted[0] == held[0].raw
    assert lines_of(admitted)[0].message.tool_calls is not None
    replaced = lines_of(reader.finish(held, TEXT, STAMP))
    assert [r.message.content for r in replaced] == [TEXT, ""]
    assert not any(r.message.tool_calls for r in replaced)
    assert [r.eval_count for r in replaced] == [None, 7]  # the counts on the done line only


def test_calls_on_the_done_line_or_on_two_lines_are_all_proposed() -> None:
    reader = OLLAMA.stream_reader({})
    assert isinstance(reader.feed(_line({"tool_calls": [CALL]}))[0], Held)
    (final,) = reader.feed(_line({"content": "", "tool_calls": [CALL]}, True, **COUNTS))
    assert isinstance(final, Final) and [p.tool for p in final.proposals] == ["echo", "echo"]
    replaced = lines_of(reader.finish([], TEXT, STAMP))
    assert not any(r.message.tool_calls for r in replaced)


def test_the_upstream_s_error_line_is_relayed_as_it_came() -> None:
    reader = OLLAMA.stream_reader({})
    reader.feed(STREAM[0])
    (event,) = reader.feed(Frame('{"error":"model is overloaded"}'))
    assert isinstance(event, ErrorEvent) and event.raw == b'{"error":"model is overloaded"}\n'


def test_a_stream_without_its_done_line_is_broken() -> None:
    reader = OLLAMA.stream_reader({})
    reader.feed(STREAM[0])
    with pytest.raises(StreamBroken) as caught:
        reader.end()
    assert caught.value.code == "upstream_stream_cut"


@pytest.mark.parametrize("data", ["not json", "[1, 2]"])
def test_an_unreadable_line_breaks_the_stream(data: str) -> None:
    with pytest.raises(StreamBroken) as caught:
        OLLAMA.stream_reader({}).feed(Frame(data))
    assert caught.value.code == "bad_upstream_response"


# -- Azure OpenAI: OpenAI's formats behind Azure's paths -------------------------------

#: n8n's Azure OpenAI Chat Model, second turn (classic endpoint, captured): the echoed
#: assistant content is an empty list, the arguments a JSON string holding the id.
AZURE_CHAT_BODY = {
    "model": "gpt4o-dep",
    "stream": False,
    "tools": [ECHO_TOOL],
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [
                {
                    "id": "call_abc123",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"q":"a","id":"call_abc123"}'},
                }
            ],
        },
        {"role": "tool", "content": '[{"response":"a"}]', "tool_call_id": "call_abc123"},
    ],
}
AZURE_RESPONSES_BODY = {
    "model": "my-codex-dep",
    "stream": False,
    "tools": [{"type": "function", "name": "echo", "parameters": {}, "strict": None}],
    "text": {},
    "input": [
        {"type": "message", "role": "system", "content": SYSTEM},
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "name": "echo", "arguments": "{}", "call_id": "call_abc123"},
        {"type": "function_call_output", "call_id": "call_abc123", "output": "[]"},
    ],
}


@pytest.mark.parametrize(
    ("adapter", "body", "output"),
    [
        (AZURE_CHAT, AZURE_CHAT_BODY, ToolOutput("call_abc123", '[{"response":"a"}]')),
        (AZURE_RESPONSES, AZURE_RESPONSES_BODY, ToolOutput("call_abc123", "[]")),
    ],
)
def test_azure_s_requests_are_openai_s_and_the_model_is_the_deployment(
    adapter: WireAdapter, body: dict[str, Any], output: ToolOutput
) -> None:
    adapter.validate(body)
    assert adapter.system_texts(body) == [SYSTEM]
    assert adapter.tool_outputs(body) == [output]
    assert adapter.offered_tools(body) == frozenset({"echo"})
    assert adapter.model(body, {"deployment": "the-deployment"}) == "the-deployment"
    assert adapter.model(body, {}) == body["model"]  # AI Foundry: the path names none
    assert adapter.api.name == "azure" and adapter.api.key_header == "api-key"
    sources = adapter.api.token_from
    assert presented_token({"api-key": "tok"}, {}, sources) == "tok"  # classic
    assert presented_token({"authorization": "Bearer tok"}, {}, sources) == "tok"  # Foundry


def test_azure_s_answers_are_the_openai_sdk_s_types() -> None:
    chat = ChatCompletion.model_validate(AZURE_CHAT.final_answer(TEXT, "dep", STAMP))
    assert chat.choices[0].message.content == TEXT
    resp = Response.model_validate(AZURE_RESPONSES.final_answer(TEXT, "dep", STAMP))
    assert resp.output_text == TEXT
    body = AZURE_CHAT.error_body("the upstream model took too long", "timeout")
    assert body["error"]["message"] == "the upstream model took too long"


def test_ollama_s_api_reads_a_bearer_token_and_sends_the_real_key_as_one() -> None:
    api = OLLAMA.api
    assert (api.name, api.key_header, api.key_prefix) == ("ollama", "Authorization", "Bearer ")
    assert presented_token({"authorization": "Bearer tok"}, {}, api.token_from) == "tok"
    assert presented_token({}, {}, api.token_from) is None


# -- the gate's own exchanges (DESIGN §5.1) ---------------------------------------------------

RECEIPT = '{"id":"lead-1"}'


def own(proposal: Proposal) -> Proposal:
    """The proposal under the gate's own id (as the gate answers it)."""
    from sidecar.core.gate_writes import own_call_id

    return Proposal(own_call_id(proposal.call_id, "0a1b2c3d"), proposal.tool, proposal.args)


def test_an_exchange_is_a_call_under_the_gate_s_own_id_then_its_tool_message() -> None:
    (write,) = OLLAMA.number_calls(first_request(), [Proposal("", "echo", {"q": "a"})])
    mine = own(write)
    out = OLLAMA.with_exchange(first_request(), mine, RECEIPT)
    assert out["messages"][:2] == OPENING
    assert out["messages"][2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": mine.call_id,
                    "type": "function",
                    "function": {"name": "echo", "arguments": {"q": "a"}},
                }
            ],
        },
        {"role": "tool", "content": RECEIPT, "tool_name": "echo"},
    ]
    for m in out["messages"]:  # messages the SDK's own type reads
        ollama.Message.model_validate(m)
    odd = OLLAMA.with_exchange(first_request(), own(Proposal("p", "t", "text")), "r")
    assert odd["messages"][2]["tool_calls"][0]["function"]["arguments"] == {}


def test_a_gate_answered_exchange_never_shifts_the_numbers_of_n8n_s_calls() -> None:
    """The request with the gate's exchange numbers its next proposal as n8n's own
    conversation does (the gate's call is not counted), and n8n's output of that
    call, in the next request, is read under the same id."""
    (write,) = OLLAMA.number_calls(first_request(), [Proposal("", "echo", {"q": "a"})])
    asked = OLLAMA.with_exchange(first_request(), own(write), RECEIPT)
    (read,) = OLLAMA.number_calls(asked, [Proposal("", "echo", {"q": "b"})])
    assert read.call_id == write.call_id == call_id(read.call_id.split("_")[1], 0)
    assert OLLAMA.tool_outputs(asked) == []  # the gate's own output answers no call of n8n's
    # n8n ran the read (it never saw the gate's exchange); the gate puts that back
    later = first_request(messages=[*OPENING, echoed("uuid-1", "b"), tool('[{"r":"b"}]')])
    spliced = OLLAMA.with_exchange(later, own(Proposal("x", "echo", {"q": "c"})), "r")
    assert OLLAMA.tool_outputs(later) == [ToolOutput(read.call_id, '[{"r":"b"}]')]
    assert OLLAMA.tool_outputs(spliced) == OLLAMA.tool_outputs(later)
    (nxt,) = OLLAMA.number_calls(spliced, [Proposal("", "echo", {})])
    assert nxt.call_id.endswith("_1")  # after n8n's one call, not after the gate's two


def test_a_call_and_its_outputs_are_one_item_an_exchange_never_splits() -> None:
    from sidecar.core.gate_writes import KeptExchange, output_anchor, user_anchor

    two = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "u1", "type": "function", "function": {"name": "echo", "arguments": {"q": "a"}}},
            {"id": "u2", "type": "function", "function": {"name": "echo", "arguments": {"q": "b"}}},
        ],
    }
    body = first_request(messages=[*OPENING, two, tool("1"), tool("2")])
    items = OLLAMA.conversation(body)
    assert [len(i.messages) for i in items] == [1, 1, 3]
    ids = [p.call_id for p in OLLAMA.number_calls(first_request(), [Proposal("", "e", {})] * 2)]
    assert [OLLAMA.item_anchor(i) for i in items] == [
        None,
        user_anchor("hi"),
        output_anchor(ids[1]),
    ]
    assert [OLLAMA.is_user_message(i) for i in items] == [False, True, False]
    assert OLLAMA.with_conversation(body, items) == body
    kept = KeptExchange(
        OLLAMA.last_anchor(body),
        own(Proposal("p", "echo", {})).call_id,
        "echo",
        {},
        "r",
        "replay",
        "o",
        0,
    )
    later = first_request(messages=[*body["messages"], {"role": "user", "content": "more"}])
    spliced = OLLAMA.with_kept(later, [kept])["messages"]
    assert [m["role"] for m in spliced] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",  # the gate's exchange: after both outputs, never between
        "tool",
        "user",
    ]
    assert OLLAMA.tool_outputs(OLLAMA.with_kept(later, [kept])) == OLLAMA.tool_outputs(later)
    # a new execution: right after the last user message
    fresh = OLLAMA.with_kept(first_request(), [kept])["messages"]
    assert [m["role"] for m in fresh] == ["system", "user", "assistant", "tool"]


def test_a_follow_on_stream_s_lines_continue_the_answer() -> None:
    reader = OLLAMA.stream_reader(first_request())
    reader.feed(
        frame({"model": "m", "message": {"role": "assistant", "content": "Hi"}, "done": False})
    )
    nxt = reader.follow_on(first_request())
    line = {"model": "m", "message": {"role": "assistant", "content": " there"}, "done": False}
    (passed,) = nxt.feed(frame(line))
    assert isinstance(passed, Passed) and passed.chars == len(" there")
    (final,) = nxt.feed(
        frame({"model": "m", "message": {"role": "assistant", "content": ""}, "done": True})
    )
    assert isinstance(final, Final) and final.proposals == []
