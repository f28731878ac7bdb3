"""Writes at the model gate (DESIGN §5.1) against an attack on them: parallel
copies of one write, a proposal that fails midway, call ids an upstream numbers
afresh, colliding business keys, outputs that only look like receipts, what a
task keeps and sends, a model that never stops proposing what is done. Driven
through the app with a scripted chat upstream (``tests/scripted_chat.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from local_http import JsonHandler, running
from scripted_chat import (
    WRITE,
    Chat,
    call,
    calls_msg,
    make_api,
    n_tool,
    op_of,
    scripted,
    task_of,
    text_msg,
    tool_msgs,
)

from conftest import AppFactory
from sidecar.core.gate_writes import (
    MAX_ASKS_PER_REQUEST,
    MAX_KEPT_ARGS_CHARS,
    hashed,
    parse_template,
    read_output,
    render_operation_id,
    require_operation_id_template,
)

pytestmark = pytest.mark.security

A, B = "ana@example.com", "bo@example.com"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_one_write_proposed_twice_in_one_answer_runs_once(
    make_app: AppFactory, stream: bool
) -> None:
    """Parallel tool calls asking for one operation twice: neither copy reaches n8n
    (it would run both); the gate answers both and asks again; the model's single
    proposal is relayed, at attempt 1: the given-back attempt was not spent."""
    with scripted() as up:

        def script(req: dict[str, Any]) -> dict[str, Any]:
            outs = [m["content"] for m in tool_msgs(req)]
            if not outs:
                n = len(up.requests)
                return calls_msg(
                    call(f"a{n}", "create_lead", {"email": A}),
                    call(f"b{n}", "create_lead", {"email": A}),
                )
            if all("proposed more than once" in o for o in outs):
                return calls_msg(call("c1", "create_lead", {"email": A}))
            return text_msg()

        up.script = script
        api = make_api(make_app, up.base, {"create_lead": WRITE})
        status, _, calls, _ = Chat(api, f"par-{stream}", stream=stream).ask()
        assert status == 200
        assert [c[0] for c in calls] == ["c1"]
        assert len(up.requests) == 2
        _, op = op_of(api, f"crm-lead:{A}")
        assert (op["operation"]["state"], op["operation"]["attempt"]) == ("in_progress", 1)


def test_a_proposal_that_fails_midway_gives_back_the_write_it_began(
    make_app: AppFactory,
) -> None:
    """[write A, write B] where B's begin is refused (the workflow's open bound):
    nothing is relayed, and A, begun but never relayed, is given back."""
    with scripted() as up:
        up.script = lambda req: calls_msg(
            call("c1", "create_lead", {"email": A}), call("c2", "create_lead", {"email": B})
        )
        api = make_api(
            make_app, up.base, {"create_lead": WRITE}, operations={"max_open_per_workflow": 1}
        )
        status, _, calls, _ = Chat(api, "midway").ask()
        assert status == 429 and calls == []
        _, op = op_of(api, f"crm-lead:{A}")
        assert (op["operation"]["state"], op["operation"]["attempt"]) == ("not_committed", 0)


def test_a_server_that_numbers_calls_afresh_can_write_after_a_settled_call(
    make_app: AppFactory,
) -> None:
    """Every answer's call is ``call_0``: once the first write has its output, the
    next ``call_0`` (another lead) is a new call, relayed, not a 409."""
    with scripted() as up:

        def script(req: dict[str, Any]) -> dict[str, Any]:
            email = A if n_tool(req) == 0 else B
            return calls_msg(call("call_0", "create_lead", {"email": email}))

        up.script = script
        api = make_api(make_app, up.base, {"create_lead": WRITE})
        agent = Chat(api, "afresh")
        _, _, calls, _ = agent.ask()
        agent.ran("call_0", "create_lead", {"email": A}, json.dumps([{"id": "l1"}]))
        status, _, calls, _ = agent.ask()
        assert status == 200 and [c[2] for c in calls] == [{"email": B}]
        assert op_of(api, f"crm-lead:{B}")[1]["operation"]["state"] == "in_progress"


@pytest.mark.parametrize(
    ("template", "first", "second"),
    [
        ("crm:{first}:{last}", {"first": "a:b", "last": "c"}, {"first": "a", "last": "b:c"}),
        # a value spelled as the hash another value is written as
        ("crm-lead:{email}", {"email": "Ana <ana@x>"}, {"email": hashed("Ana <ana@x>")}),
        ("o:{a}-{b}", {"a": "1-2", "b": "3"}, {"a": "1", "b": "2-3"}),
    ],
)
def test_two_business_keys_never_name_one_operation(
    template: str, first: dict[str, str], second: dict[str, str]
) -> None:
    parsed = parse_template(template)
    assert render_operation_id(parsed, first) != render_operation_id(parsed, second)
    # stable: the same value names the same operation
    assert render_operation_id(parsed, first) == render_operation_id(parsed, dict(first))


def test_two_parts_with_nothing_between_them_are_refused() -> None:
    with pytest.raises(ValueError, match="text between them"):
        require_operation_id_template(parse_template("x{a}{b}"))
    require_operation_id_template(parse_template("x{a}:{b}"))


@pytest.mark.parametrize(
    "output",
    ['{"id": 1e400}', '[{"error": "a"}, {"error": "b"}]'],
    ids=["overflowing-number", "error-items"],
)
def test_outputs_that_only_look_like_receipts_are_not(output: str) -> None:
    assert read_output(output, None).committed is False


def test_text_parts_are_read_as_the_text_the_model_reads(make_app: AppFactory) -> None:
    """A tool message whose content is text parts holding n8n's error item is not
    a receipt: the write is unproven, and the task ends needs_reconciliation."""
    with scripted() as up:
        up.script = lambda req: (
            calls_msg(call("c1", "create_lead", {"email": A})) if n_tool(req) == 0 else text_msg()
        )
        api = make_api(make_app, up.base, {"create_lead": WRITE})
        agent = Chat(api, "parts")
        agent.ask()
        parts = [{"type": "text", "text": json.dumps([{"error": "refused"}])}]
        agent.ran("c1", "create_lead", {"email": A}, parts)  # type: ignore[arg-type]
        status, text, _, _ = agent.ask()
        assert status == 200 and "needs_reconciliation" in text
        assert op_of(api, f"crm-lead:{A}")[1]["operation"]["state"] == "unknown"


def test_what_a_task_keeps_is_bounded_and_one_per_operation(make_app: AppFactory) -> None:
    """A committed write with huge arguments is replayed but not kept (every later
    request would carry it); a write replayed twice is kept once."""
    huge = {"email": A, "note": "x" * MAX_KEPT_ARGS_CHARS}
    with scripted() as up:
        state = {"args": huge}
        up.script = lambda req: (
            calls_msg(call(f"c{len(up.requests)}", "create_lead", state["args"]))
            if all("lead-1" not in m["content"] for m in tool_msgs(req))
            else text_msg()
        )
        api = make_api(make_app, up.base, {"create_lead": WRITE})
        first = Chat(api, "kept")
        _, _, calls, _ = first.ask()
        first.ran(calls[0][0], "create_lead", huge, json.dumps([{"id": "lead-1"}]))
        first.ask()
        Chat(api, "kept").ask()  # replayed: too big to keep
        assert task_of(api, "kept")["gate_exchanges"] == []
        small = {"email": B}
        state["args"] = small
        second = Chat(api, "kept-2", text="bo")
        _, _, calls, _ = second.ask()
        second.ran(calls[0][0], "create_lead", small, json.dumps([{"id": "lead-1"}]))
        second.ask()
        for _ in range(2):
            Chat(api, "kept-2", text="bo again").ask()  # replayed each time
        kept = task_of(api, "kept-2")["gate_exchanges"]
        assert [e["operation_id"] for e in kept] == [f"crm-lead:{B}"]


def test_a_model_that_keeps_proposing_a_done_write_is_answered_after_a_bound(
    make_app: AppFactory,
) -> None:
    """A committed write proposed again on every ask: one request asks the upstream
    at most MAX_ASKS_PER_REQUEST times, then the gate answers the agent itself."""
    with scripted() as up:
        up.script = lambda req: calls_msg(call(f"c{len(up.requests)}", "create_lead", {"email": A}))
        api = make_api(make_app, up.base, {"create_lead": WRITE}, limits={"max_model_calls": 1000})
        first = Chat(api, "stubborn")
        first.ask()
        first.ran("c1", "create_lead", {"email": A}, json.dumps([{"id": "lead-1"}]))
        first.ask()  # settles the write; the model proposes it again: replayed
        before = len(up.requests)
        status, text, calls, _ = Chat(api, "stubborn").ask()
        assert status == 200 and calls == []
        assert "already done" in text
        assert len(up.requests) - before == MAX_ASKS_PER_REQUEST


def test_a_write_the_reconcile_check_found_shows_the_model_no_url(
    make_app: AppFactory,
) -> None:
    """The receipt of a write the check found names the check, never the system
    of record's address (the model provider would see it)."""

    class Found(JsonHandler):
        def do_GET(self) -> None:
            self._json(200, {"id": "lead-9"})

    with scripted() as up, running(Found) as crm:
        up.script = lambda req: (
            calls_msg(call(f"c{len(up.requests)}", "create_lead", {"email": A}))
            if n_tool(req) == 0
            else text_msg()
        )
        tool = {
            **WRITE,
            "committed_when": "id != null",
            "reconcile": {"check": "lead_found", "input": {"email": "{email}"}},
        }
        checks = {"lead_found": {"kind": "http", "url": crm + "/internal/leads/{email}"}}
        api = make_api(make_app, up.base, {"create_lead": tool}, checks=checks)
        agent = Chat(api, "found")
        agent.ask()
        agent.ran("c1", "create_lead", {"email": A}, "Lead saved!")
        agent.ask()
        _, op = op_of(api, f"crm-lead:{A}")
        assert op["operation"]["receipt"] == {"check": "lead_found", "found": True}
        Chat(api, "found").ask()  # replayed to the model
        sent = [m["content"] for r in up.requests for m in tool_msgs(r)]
        assert not any("internal" in s or "127.0.0.1" in s for s in sent)
