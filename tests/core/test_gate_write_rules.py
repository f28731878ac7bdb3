"""The pure rules of writes at the model gate (DESIGN §5.1): templates, what a
tool's output proves, and where kept exchanges go back (no app, no store)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jmespath
import pytest

from sidecar.core.gate_writes import (
    MAX_KEPT,
    KeptExchange,
    TemplateError,
    kept_with,
    output_anchor,
    parse_input_templates,
    parse_template,
    read_output,
    render_input,
    render_operation_id,
    require_operation_id_template,
    splice,
    user_anchor,
)
from sidecar.gate.wire import OPENAI_CHAT, OPENAI_RESPONSES
from sidecar.gate.wire.base import Frame, Proposal


@pytest.mark.parametrize(
    ("template", "args", "expected"),
    [
        ("crm-lead:{email}", {"email": "ana@example.com"}, "crm-lead:ana@example.com"),
        ("order:{id}:v{version}", {"id": 42, "version": 3.0}, "order:42:v3"),
        ("flag:{on}", {"on": True}, "flag:true"),
        ("c:{contact.email}", {"contact": {"email": "a@b.c"}}, "c:a@b.c"),
        ("{email}", {"email": "x"}, "x"),
    ],
)
def test_a_template_renders_a_business_key(template: str, args: Any, expected: str) -> None:
    assert render_operation_id(parse_template(template), args) == expected


def test_a_value_outside_the_pattern_is_replaced_by_its_hash() -> None:
    value = "Ana Lopez <ana@example.com>"
    rendered = render_operation_id(parse_template("crm-lead:{email}"), {"email": value})
    assert rendered == "crm-lead:h" + hashlib.sha256(value.encode()).hexdigest()[:20]
    long = "a" * 65
    assert render_operation_id(parse_template("k:{v}"), {"v": long}).startswith("k:h")


@pytest.mark.parametrize(
    "args", [{}, {"email": None}, {"email": ""}, {"email": {}}, {"email": [1]}, "text", None]
)
def test_a_part_that_yields_no_scalar_is_a_template_error(args: Any) -> None:
    with pytest.raises(TemplateError):
        render_operation_id(parse_template("crm-lead:{email}"), args)


@pytest.mark.parametrize("bad", ["x:{email", "x:email}", "x:{}", "x:{[}", "x:{a}}"])
def test_a_template_that_does_not_parse_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_template(bad)


def test_literal_text_must_be_operation_id_characters() -> None:
    with pytest.raises(ValueError):
        require_operation_id_template(parse_template("crm lead:{email}"))
    require_operation_id_template(parse_template("crm-lead:{email}"))


def test_reconcile_input_templates_keep_a_whole_value_and_fill_text() -> None:
    parsed = parse_input_templates({"email": "{email}", "q": "lead {email}", "n": 1})
    out = render_input(parsed, {"email": "a@b.c"})
    assert out == {"email": "a@b.c", "q": "lead a@b.c", "n": 1}


CW = jmespath.compile("id != null")


@pytest.mark.parametrize(
    ("output", "committed_when", "committed", "receipt"),
    [
        ('[{"id":"lead-1"}]', CW, True, {"id": "lead-1"}),  # a list of one: that item
        ('{"id":"lead-1"}', CW, True, {"id": "lead-1"}),
        ('[{"id":1},{"id":2}]', None, True, [{"id": 1}, {"id": 2}]),
        ('[{"saved":true}]', CW, False, {"saved": True}),
        ("Lead saved!", None, False, None),
        ('""', None, False, ""),
        ("[]", None, False, []),
        ('[{"error":"refused"}]', None, False, {"error": "refused"}),  # n8n's error item
        ('{"error":"x","errorType":"NodeApiError"}', None, False, None),
        ('[{"error":null,"id":"x"}]', CW, True, {"error": None, "id": "x"}),
        ("NaN", None, False, None),
    ],
)
def test_what_an_output_proves(
    output: str, committed_when: Any, committed: bool, receipt: Any
) -> None:
    reading = read_output(output, committed_when)
    assert reading.committed is committed
    if receipt is not None:
        assert reading.receipt == receipt


def _ex(call_id: str, anchor: str | None) -> KeptExchange:
    return KeptExchange(anchor, call_id, "t", {}, "out", "replay", "op", 0.0)


def test_only_a_replay_is_kept_and_the_kept_are_bounded() -> None:
    """A settled write stays true; "another execution is writing this" does not
    (DESIGN §5.1, as built: an in_progress answer answers its own request only)."""
    held = KeptExchange(None, "call_2_g1", "t", {}, "busy", "in_progress", "op2", 0.0)
    kept = kept_with((), [_ex("call_1_g1", None), held])
    assert [d["call_id"] for d in kept] == ["call_1_g1"]
    many = kept_with(kept, [_ex(f"call_{n}_g2", None) for n in range(MAX_KEPT + 3)])
    assert len(many) == MAX_KEPT and many[-1]["call_id"] == f"call_{MAX_KEPT + 2}_g2"


def _items(e: KeptExchange) -> list[Any]:
    return [("call", e.call_id), ("output", e.call_id)]


def _anchor(item: Any) -> str | None:
    kind, name = item
    if kind == "output":
        return output_anchor(name)
    return user_anchor(name) if kind == "user" else None


def _user(item: Any) -> bool:
    return bool(item[0] == "user")


def test_splice_puts_an_exchange_after_its_item_or_the_last_user_message() -> None:
    items = [("system", ""), ("user", "hi"), ("call", "a"), ("output", "a"), ("user", "more")]
    kept = [_ex("g1", output_anchor("a")), _ex("g2", output_anchor("g1")), _ex("g3", "gone")]
    out = splice(items, kept, _anchor, _user, _items)
    assert out == [
        ("system", ""),
        ("user", "hi"),
        ("call", "a"),
        ("output", "a"),
        ("call", "g1"),
        ("output", "g1"),
        ("call", "g2"),
        ("output", "g2"),
        ("user", "more"),
        ("call", "g3"),
        ("output", "g3"),
    ]
    assert splice(out, kept, _anchor, _user, _items) == out  # never put back twice
    fresh = [("system", ""), ("user", "hi")]
    assert splice(fresh, kept[:1], _anchor, _user, _items) == [
        *fresh,
        ("call", "g1"),
        ("output", "g1"),
    ]


# -- the adapters' primitives, as tables --------------------------------------------------------

PROPOSAL = Proposal("call_9", "create_lead", {"email": "a@b.c"})


def test_chat_appends_and_splices_an_exchange_as_the_agent_would_send_it() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a@b.c"}]}
    out = OPENAI_CHAT.with_exchange(body, PROPOSAL, '{"id":"lead-1"}')
    assert out["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "create_lead", "arguments": '{"email":"a@b.c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": '{"id":"lead-1"}'},
    ]
    kept = KeptExchange(
        OPENAI_CHAT.last_anchor(body),
        "call_9",
        "create_lead",
        {"email": "a@b.c"},
        '{"id":"lead-1"}',
        "replay",
        "crm-lead:a@b.c",
        0.0,
    )
    later = {**body, "messages": [*body["messages"], {"role": "user", "content": "again"}]}
    spliced = OPENAI_CHAT.with_kept(later, [kept])
    assert [m["role"] for m in spliced["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
    ]


def test_responses_appends_and_splices_an_exchange_as_the_agent_would_send_it() -> None:
    body = {"input": "a@b.c", "instructions": "s"}
    out = OPENAI_RESPONSES.with_exchange(body, PROPOSAL, "r")
    assert out["input"] == [
        {"type": "message", "role": "user", "content": "a@b.c"},
        {
            "type": "function_call",
            "call_id": "call_9",
            "name": "create_lead",
            "arguments": '{"email":"a@b.c"}',
        },
        {"type": "function_call_output", "call_id": "call_9", "output": "r"},
    ]
    kept = KeptExchange(None, "call_9", "create_lead", {"email": "a@b.c"}, "r", "replay", "o", 0)
    spliced = OPENAI_RESPONSES.with_kept({"input": [{"role": "user", "content": "x"}]}, [kept])
    assert [i.get("type", "message") for i in spliced["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]


def _sse(data: dict[str, Any]) -> Frame:
    return Frame(json.dumps(data), data.get("type"))


def test_a_chat_follow_on_stream_continues_the_completion() -> None:
    """The second stream of one request: its chunks carry the first completion's
    id, and no second ``role`` (a client joins the deltas of one completion)."""
    first = OPENAI_CHAT.stream_reader({})
    first.feed(_sse({"id": "c-1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    nxt = first.follow_on({})
    (event,) = nxt.feed(
        _sse(
            {"id": "c-2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "F"}}]}
        )
    )
    sent = json.loads(event.raw.decode().split("data: ", 1)[1])
    assert sent["id"] == "c-1" and sent["choices"][0]["delta"] == {"content": "F"}
    # the role came with the proposal, which was held (never sent): the follow-on keeps it
    held = OPENAI_CHAT.stream_reader({})
    call = {"index": 0, "id": "call_1", "function": {"name": "t", "arguments": "{}"}}
    held.feed(
        _sse(
            {
                "id": "c-1",
                "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}],
            }
        )
    )
    (event,) = held.follow_on({}).feed(
        _sse(
            {"id": "c-2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "F"}}]}
        )
    )
    sent = json.loads(event.raw.decode().split("data: ", 1)[1])
    assert sent["id"] == "c-1" and sent["choices"][0]["delta"]["role"] == "assistant"


def test_a_responses_follow_on_stream_continues_the_answer() -> None:
    """The second stream of one request: no second response.created, its output
    indexes after the items already passed, its sequence numbers after the last."""
    first = OPENAI_RESPONSES.stream_reader({})
    for data in (
        {"type": "response.created", "sequence_number": 0, "response": {}},
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": {"type": "message"},
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 2,
            "output_index": 0,
            "delta": "Hi",
        },
        {
            "type": "response.output_item.added",
            "sequence_number": 3,
            "output_index": 1,
            "item": {"type": "function_call"},
        },
    ):
        first.feed(_sse(data))
    nxt = first.follow_on({})
    assert nxt.feed(_sse({"type": "response.created", "sequence_number": 0, "response": {}})) == []
    (event,) = nxt.feed(
        _sse(
            {
                "type": "response.output_item.added",
                "sequence_number": 1,
                "output_index": 0,
                "item": {"type": "message"},
            }
        )
    )
    sent = json.loads(event.raw.decode().split("data: ", 1)[1])
    assert sent["output_index"] == 1 and sent["sequence_number"] > 3


def test_the_gate_s_own_call_ids_are_told_from_every_other() -> None:
    from sidecar.core.gate_writes import is_own_call_id, own_call_id

    mine = own_call_id("ollama_0123456789ab_0", "0a1b2c3d")
    assert mine == "ollama_0123456789ab_0_g0a1b2c3d" and is_own_call_id(mine)
    assert own_call_id("", "0a1b2c3d") == "call_g0a1b2c3d"
    for other in (
        "ollama_0123456789ab_0",
        "toolu_01ABC",
        "a13cf06c-0b1e-4c5e-9d7f-6a2b3c4d5e6f",
        3,
        None,
    ):
        assert not is_own_call_id(other)
    with pytest.raises(ValueError):
        own_call_id("x", "not-hex!")
