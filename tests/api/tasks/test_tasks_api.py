"""The task guard through HTTP on every store: every terminal reason is reached,
malformed calls change nothing, scopes and resume rules hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from task_agent import REACHED, Agent, admit_at_once

from conftest import ADMIN_TOKEN, SCOPED_TOKEN, TESTS, Api, AppFactory, Clock
from sidecar.core.tasks import EndReason


def ended(out: dict[str, Any], status: str, reason: str) -> None:
    assert out["envelope"] is not None, out
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == (status, reason), out


def test_deadline(api: Api, clock: Clock) -> None:
    a = Agent(api, limits={"deadline_s": 60})
    a.call("search", {"q": 1})
    clock.advance(61)
    out = a.call("search", {"q": 2})
    ended(out, "partial", "deadline")
    assert out["envelope"]["used"]["elapsed_s"] == 61
    assert "final answer" in out["message"]


def test_token_budget_and_wrap_up(api: Api) -> None:
    a = Agent(api, limits={"max_tokens": 1000, "wrap_up_ratio": 0.5})
    assert a.model()["wrap_up"] is False
    assert a.model(tokens_used=600)["wrap_up"] is True
    out = a.model(tokens_used=500)
    assert out["decision"] == "deny"
    ended(out, "partial", "token_budget")
    assert out["envelope"]["used"]["tokens"] == 1100


def test_poll_budget(api: Api) -> None:
    a = Agent(api, limits={"max_polls": 2})
    for pct in (10, 20):
        a.result(a.call("job", {"id": 1}, kind="poll"), result={"pct": pct})
    ended(a.call("job", {"id": 1}, kind="poll"), "partial", "poll_budget")


def test_poll_deadline(api: Api, clock: Clock) -> None:
    a = Agent(api, limits={"poll_deadline_s": 100})
    a.result(a.call("job", {"id": 1}, kind="poll"), result={"pct": 1})
    clock.advance(101)
    ended(a.call("job", {"id": 1}, kind="poll"), "partial", "poll_budget")


def test_per_tool_budget_from_configuration(make_app: AppFactory) -> None:
    api = Api(make_app(tools={"update_order": {"kind": "write", "max_calls": 1}}).test_client())
    a = Agent(api)
    first = a.call("update_order", {"o": 1}, kind="write", operation_id="o:1")
    a.result(first, result={}, receipt="r1")
    ended(
        a.call("update_order", {"o": 2}, kind="write", operation_id="o:2"), "partial", "tool_budget"
    )


@pytest.mark.parametrize(
    ("stop_path", "reason"),
    [
        ("/v1/workflows/wf-sheets/stop", "workflow_stopped"),
        ("/v1/chains/{chain}/stop", "chain_stopped"),
    ],
)
def test_stops_end_the_task(api: Api, stop_path: str, reason: str) -> None:
    _, act = api.post("/v1/activations", {"workflow": "wf-sheets", "content": {"a": 1}})
    a = Agent(api, chain_id=act["chain_id"])
    api.post(stop_path.format(chain=act["chain_id"]), {"reason": "x"}, token=ADMIN_TOKEN)
    ended(a.call("search", {"q": 1}), "stopped", reason)


def test_policy_denied(make_app: AppFactory) -> None:
    api = Api(make_app(policies={"support": {"tools": ["search_orders"]}}).test_client())
    a = Agent(api, policy="support")
    assert a.call("search_orders", {"q": 1})["decision"] == "execute"
    out = a.call("delete_everything", {})
    ended(out, "blocked", "policy_denied")
    assert "not allowed" in out["message"]


def test_operation_conflict(api: Api) -> None:
    a = Agent(api)
    a.result(
        a.call("charge", {"amount": 10}, kind="write", operation_id="charge:1"),
        result={},
        receipt="ch_1",
    )
    ended(
        a.call("charge", {"amount": 99}, kind="write", operation_id="charge:1"),
        "blocked",
        "operation_conflict",
    )


def test_a_committed_write_asked_for_again_is_replayed_and_bounded_by_the_model_budget(
    api: Api,
) -> None:
    """A replay executes nothing, so it is exempt from the identical-call rule
    and spends no tool budget (as the reference runners count); a model that
    keeps asking for it is bounded by its model turns."""
    a = Agent(api, limits={"max_same_call": 2, "max_model_calls": 4, "max_tool_calls": 2})
    note = {"note": "again"}
    assert a.model()["decision"] == "admit"
    first = a.call("create_note", note, kind="write", operation_id="note:1")
    assert first["decision"] == "execute"
    a.result(first, result={"id": "n1"}, receipt={"id": "n1"})
    for _ in range(3):
        assert a.model()["decision"] == "admit"
        again = a.call("create_note", note, kind="write", operation_id="note:1")
        assert (again["decision"], again["receipt"], again["envelope"]) == (
            "replay",
            {"id": "n1"},
            None,
        )
    used = api.get(a.base)[1]["task"]["used"]
    assert (used["tool_calls"], used["replays"]) == (1, 3)
    out = a.model()
    assert out["decision"] == "deny"
    ended(out, "partial", "model_budget")
    assert a.call("create_note", note, kind="write", operation_id="note:1")["decision"] == "deny"


def test_a_test_task_is_found_from_a_sub_workflow_that_says_production(api: Api) -> None:
    """n8n runs an agent's tool sub-workflow in mode ``integrated``, so its
    ``$execution.mode`` says ``production`` under a test run: the task id wins,
    and the tool's write lands in the test namespace with its task."""
    a = Agent(api, execution_mode="test")  # the rest of the calls say production
    call = a.call("create_note", {"n": 1}, kind="write", operation_id="note:t")
    assert call["decision"] == "execute"
    assert a.result(call, result={}, receipt={"id": "n1"})["decision"] == "recorded"
    assert api.get("/v1/operations/note:t", execution_mode="test", workflow="wf-sheets")[0] == 200
    assert api.get("/v1/operations/note:t", workflow="wf-sheets")[0] == 404
    assert api.get(a.base)[0] == 200
    assert api.post("/v1/tasks/t00000000000000000000/stop", {"reason": "x"})[0] == 404
    done = api.post(a.base + "/complete", {"evidence": {"done": True, "revision": 1}})
    assert done[0] == 200, done


def test_a_test_run_never_reaches_a_production_task(api: Api) -> None:
    """Only production requests fall back to the test namespace: an editor run
    (say, debugging a pinned production execution) cannot spend, stop or
    write through a production task."""
    a = Agent(api)  # production
    test = {"execution_mode": "test"}
    call = {"tool": "t", "kind": "write", "args": {}, "operation_id": "w:1", **test}
    assert api.post(a.base + "/tool-calls", call)[0] == 404
    assert api.post(a.base + "/stop", {"reason": "x", **test})[0] == 404
    assert api.get(a.base, execution_mode="test")[0] == 404
    assert api.get("/v1/operations/w:1")[0] == 404
    assert api.get(a.base)[1]["task"]["status"] == "running"


def test_a_re_activation_continues_every_count_and_replays_committed_writes(api: Api) -> None:
    """Creating the task again under its task_key (an error branch re-entering
    the flow, a re-fired trigger, an execution re-run) continues the counts:
    the same read, once per activation, is denied the third time. A committed
    write asked for again in each activation is replayed. Only a resume
    starts the identical-call count again."""
    body = {"workflow": "wf-sheets", "task_key": "ticket-9", "limits": {"max_same_call": 2}}
    status, created = api.post("/v1/tasks", body)
    assert status == 201
    base = f"/v1/tasks/{created['task']['task_id']}"
    write = {"tool": "create_note", "kind": "write", "args": {"n": 1}, "operation_id": "note:9"}
    read = {"tool": "get_ticket", "kind": "read", "args": {"id": 9}}
    first = api.post(base + "/tool-calls", write)[1]
    assert first["decision"] == "execute"
    api.post(base + f"/tool-calls/{first['call_id']}/result", {"status": "ok", "receipt": "n1"})
    for activation in range(2):
        if activation:
            again = api.post("/v1/tasks", body)
            assert again[0] == 200 and again[1]["task"]["activations"] == activation + 1
        assert api.post(base + "/tool-calls", write)[1]["decision"] == "replay"
        out = api.post(base + "/tool-calls", read)[1]
        assert out["decision"] == "execute", out
        api.post(base + f"/tool-calls/{out['call_id']}/result", {"status": "retryable"})
    assert api.post("/v1/tasks", body)[0] == 200
    assert api.post(base + "/tool-calls", write)[1]["decision"] == "replay"
    ended(api.post(base + "/tool-calls", read)[1], "partial", "same_call")
    # Creating an ended task again changes nothing: it stays ended.
    assert api.post("/v1/tasks", body)[1]["envelope"]["reason"] == "same_call"
    # A resume is a new run: the identical-call count starts again, budgets go on.
    status, resumed = api.post(base + "/resume", {"reason": "looked at it"}, token=ADMIN_TOKEN)
    assert status == 200 and resumed["task"]["used"]["tool_calls"] == 3
    assert api.post(base + "/tool-calls", read)[1]["decision"] == "execute"
    assert api.post(base + "/tool-calls", write)[1]["decision"] == "replay"


def test_fatal_result(api: Api) -> None:
    a = Agent(api)
    out = a.result(a.call("search", {"q": 1}), "fatal", result={"error": "400"})
    ended(out, "blocked", "fatal_result")


def test_fatal_write_without_proof_is_uncertain(api: Api) -> None:
    a = Agent(api)
    out = a.result(a.call("post", {"x": 1}, kind="write", operation_id="p:1"), "fatal")
    ended(out, "blocked", "fatal_result")
    assert out["envelope"]["uncertain_operations"] == ["p:1"]


@pytest.mark.parametrize("evidence", [{"revision": 2}, {"done": True}])
def test_invalid_evidence(api: Api, evidence: dict[str, Any]) -> None:
    a = Agent(api)
    a.result(a.call("read", {"p": 1}), result={}, evidence={"revision": 3})
    status = "ok" if "revision" in evidence else "retryable"
    out = a.result(a.call("read", {"p": 2}), status, result={}, evidence=evidence)
    ended(out, "blocked", "invalid_evidence")


def test_retry_after_commit_and_proven_absent_write(api: Api) -> None:
    a = Agent(api)
    first = a.call("send", {"to": "x"}, kind="write", operation_id="mail:1")
    out = a.result(first, "retryable", evidence={"effect": "not_committed"})
    assert out["decision"] == "recorded"  # proven not written: a retry is fine
    retry = a.call("send", {"to": "x"}, kind="write", operation_id="mail:1")
    assert retry["decision"] == "execute"
    out = a.result(retry, "retryable")
    ended(out, "needs_reconciliation", "retry_after_commit")
    assert (
        api.get("/v1/operations/mail:1", workflow="wf-sheets")[1]["operation"]["state"] == "unknown"
    )


def test_ok_write_without_receipt_is_unknown_commit(api: Api) -> None:
    a = Agent(api)
    out = a.result(a.call("send", {"to": "x"}, kind="write", operation_id="mail:2"), "ok")
    ended(out, "needs_reconciliation", "unknown_commit")


def test_exhausted_write_is_retry_budget(make_app: AppFactory) -> None:
    api = Api(make_app(operations={"max_attempts": 1}).test_client())
    a = Agent(api)
    first = a.call("send", {"to": "x"}, kind="write", operation_id="mail:3")
    a.result(first, "retryable", evidence={"effect": "not_committed"})
    ended(
        a.call("send", {"to": "x"}, kind="write", operation_id="mail:3"), "partial", "retry_budget"
    )


def test_concurrent_write_of_another_worker_is_denied_without_ending(api: Api) -> None:
    api.begin("shared:1", {"to": "x"}, workflow="wf-sheets")  # another worker holds the lease
    a = Agent(api)
    out = a.call("send", {"to": "x"}, kind="write", operation_id="shared:1")
    assert out["decision"] == "deny" and out["reason"] == "in_progress"
    assert out["envelope"] is None and "another worker" in out["message"]


def test_complete_needs_trusted_evidence_and_costs_an_idle_step(api: Api) -> None:
    a = Agent(api, limits={"max_idle": 2})
    out = a.post("/complete", {})
    assert out["decision"] == "continue" and out["reason"] == "check_failed"
    out = a.post("/complete", {"evidence": {"done": False}})
    assert out["decision"] == "ended"
    ended(out, "partial", "no_progress")
    assert a.post("/complete", {"evidence": {"done": True}})["decision"] == "ended"


def test_stop_is_sticky_and_resume_extends_with_admin_only(api: Api) -> None:
    a = Agent(api, limits={"max_tool_calls": 1})
    a.result(a.call("search", {"q": 1}), result={"x": 1})
    ended(a.call("search", {"q": 2}), "partial", "tool_budget")
    status, body = api.post(f"{a.base}/resume", {"reason": "more", "extend": {"max_tool_calls": 3}})
    assert status == 403
    status, body = api.post(
        f"{a.base}/resume",
        {"reason": "approved by ops", "extend": {"max_tool_calls": 3}},
        token=ADMIN_TOKEN,
    )
    assert status == 200 and body["task"]["attempt"] == 2
    assert body["task"]["limits"]["max_tool_calls"] == 3
    assert body["task"]["used"]["tool_calls"] == 1  # counters are kept
    assert a.call("search", {"q": 3})["decision"] == "execute"
    status, body = api.post(f"{a.base}/resume", {"reason": "x"})
    assert status == 409  # running: nothing to resume


def test_only_an_admin_raises_limits_or_resumes_a_stop(api: Api) -> None:
    status, out = api.post(
        "/v1/tasks", {"workflow": "wf-sheets", "limits": {"max_tool_calls": 100}}
    )
    assert status == 403 and "max_tool_calls" in out["detail"]
    status, out = api.post("/v1/tasks", {"workflow": "wf-sheets", "limits": {"deadline_s": 1e15}})
    assert status == 422
    tight = Agent(api, limits={"max_tool_calls": 3, "max_cycle_repeats": 2})
    assert api.get(tight.base)[1]["task"]["limits"]["max_tool_calls"] == 3
    status, _ = api.post("/v1/tasks", {"workflow": "wf-sheets", "limits": {"max_cycle_repeats": 1}})
    assert status == 422  # cycle detection cannot be turned off
    assert Agent(api, token=ADMIN_TOKEN, limits={"max_tool_calls": 100}).id
    api.post(f"{tight.base}/stop", {"reason": "hold"}, token=ADMIN_TOKEN)
    status, _ = api.post(f"{tight.base}/resume", {"reason": "go on"})
    assert status == 403
    status, _ = api.post(f"{tight.base}/resume", {"reason": "go on"}, token=ADMIN_TOKEN)
    assert status == 200


def test_create_is_idempotent_on_task_key_per_workflow(api: Api) -> None:
    s1, first = api.post("/v1/tasks", {"workflow": "wf-sheets", "task_key": "k"})
    s2, again = api.post("/v1/tasks", {"workflow": "wf-sheets", "task_key": "k"})
    s3, other = api.post("/v1/tasks", {"workflow": "wf-crm", "task_key": "k"})
    assert (s1, s2, s3) == (201, 200, 201)
    assert first["task"]["task_id"] == again["task"]["task_id"] != other["task"]["task_id"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"tool": "send", "kind": "write", "args": {}}, ["body", "operation_id"]),
        ({"tool": "send", "kind": "delete", "args": {}}, ["body", "kind"]),
        ({"tool": "", "kind": "read"}, ["body", "tool"]),
        ({"kind": "read"}, ["body", "tool"]),
        ({"tool": "x", "kind": "read", "argz": {}}, ["body", "argz"]),
    ],
)
def test_malformed_call_is_422_and_changes_nothing(
    api: Api, body: dict[str, Any], loc: list[Any]
) -> None:
    a = Agent(api)
    status, out = api.post(f"{a.base}/tool-calls", body)
    assert status == 422 and loc in [e["loc"] for e in out["errors"]], out
    assert api.get(a.base)[1]["task"]["used"]["tool_calls"] == 0


def test_configured_kind_wins(make_app: AppFactory) -> None:
    api = Api(make_app(tools={"update_order": {"kind": "write"}}).test_client())
    a = Agent(api)
    status, out = api.post(f"{a.base}/tool-calls", {"tool": "update_order", "kind": "read"})
    assert status == 422 and out["errors"][0]["loc"] == ["body", "kind"]


def test_result_errors(api: Api) -> None:
    a = Agent(api)
    call = a.call("search", {"q": 1})
    a.result(call, result={})
    status, out = api.post(f"{a.base}/tool-calls/{call['call_id']}/result", {"status": "ok"})
    assert status == 409
    status, out = api.post(f"{a.base}/tool-calls/k0000000000000000/result", {"status": "ok"})
    assert status == 404
    status, out = api.post(
        f"{a.base}/tool-calls/{call['call_id']}/result",
        {"status": "ok", "evidence": {"revison": 1}},
    )
    assert status == 422 and out["errors"][0]["loc"] == ["body", "evidence", "revison"]


def test_unknown_policy_and_scopes(api: Api) -> None:
    status, out = api.post("/v1/tasks", {"workflow": "wf-sheets", "policy": "nope"})
    assert status == 422 and out["errors"][0]["loc"] == ["body", "policy"]
    a = Agent(api, workflow="wf-crm")
    scoped = Api(api.client, SCOPED_TOKEN)
    assert scoped.get(a.base)[0] == 403
    assert scoped.post(f"{a.base}/tool-calls", {"tool": "x", "kind": "read"})[0] == 403
    assert scoped.post("/v1/tasks", {})[0] == 403
    assert api.get("/v1/tasks/t00000000000000000000")[0] == 404
    assert api.get("/v1/tasks/nope")[0] == 422


def test_unverified_result_when_the_tools_check_cannot_run(make_app: AppFactory) -> None:
    api = Api(
        make_app(
            checks={"down": {"kind": "http", "url": "http://127.0.0.1:9/x/{id}", "timeout_s": 1}},
            tools={"lookup": {"kind": "read", "check": "down"}},
        ).test_client()
    )
    a = Agent(api)
    ended(a.result(a.call("lookup", {"id": 1}), result={"id": 1}), "blocked", "unverified_result")


def test_a_malformed_gate_proposal_ends_the_task_invalid_call(make_app: AppFactory) -> None:
    """The model gate's screening (a call without id, or of a tool not offered) ends
    the task blocked, invalid_call, and the task's HTTP view shows it."""
    from sidecar.auth import Principal
    from sidecar.core.tasks import CallFlaw, CallKind
    from sidecar.service.task_inputs import CallInput

    app = make_app()
    api = Api(app.test_client())
    a = Agent(api)
    tasks = app.extensions["loopstop"].tasks
    with app.test_request_context():
        who = Principal("n8n", None, False)
        call = CallInput("drop_tables", CallKind.READ, {}, None, "call_1", CallFlaw.INVALID)
        _, out = tasks.tool_call(who, "p", a.id, call)
        assert str(out.reason) == "invalid_call"
    envelope = api.get(a.base)[1]["envelope"]
    assert (envelope["status"], envelope["reason"]) == ("blocked", "invalid_call")
    REACHED.add("invalid_call")


def test_money_budget_reserves_then_settles_and_never_overspends(make_app: AppFactory) -> None:
    """The model gate reserves a turn's worst-case cost and settles the real one;
    ``max_cost`` comes in ``limits`` and ``used.cost`` shows what was settled."""
    app = make_app()
    api = Api(app.test_client())
    a = Agent(api, limits={"max_cost": 1.0, "wrap_up_ratio": 0.5})
    assert api.get(a.base)[1]["task"]["limits"]["max_cost"] == 1.0
    tasks = app.extensions["loopstop"].tasks
    with app.test_request_context():
        from sidecar.auth import Principal

        who = Principal("n8n", None, False)
        task, out = tasks.model_call(who, "p", a.id, None, reserve_cost=0.4)
        assert out.admitted and not out.wrap_up
        task, out = tasks.model_call(who, "p", a.id, None, reserve_cost=0.4)
        assert out.admitted  # 0.8 reserved
        task, out = tasks.model_call(who, "p", a.id, None, reserve_cost=0.4)
        assert not out.admitted and str(out.reason) == "cost_budget"  # would pass 1.0
        assert task.envelope is not None and str(task.envelope.status) == "partial"
        task = tasks.settle_model_call(who, "p", a.id, 0.4, 0.1, 120)
        assert (task.used.cost, task.used.reserved_cost, task.used.tokens) == (0.1, 0.4, 120)
    out = api.get(a.base)[1]
    assert out["task"]["used"]["cost"] == 0.1 and out["envelope"]["used"]["cost"] == 0.0
    REACHED.add("cost_budget")


@pytest.mark.all_stores
def test_a_settle_applied_again_under_its_turn_id_counts_once(make_app: AppFactory) -> None:
    """The gate keeps a settle the store refused and applies it later; if the
    refused one had landed after all, the second changes nothing."""
    app = make_app(limits={"max_cost": 1.0})
    a = Agent(Api(app.test_client()))
    tasks = app.extensions["loopstop"].tasks
    with app.test_request_context():
        from sidecar.auth import Principal

        who = Principal("n8n", None, False)
        assert tasks.model_call(who, "p", a.id, None, reserve_cost=0.4)[1].admitted
        for _ in range(2):
            task = tasks.settle_model_call(who, "p", a.id, 0.4, 0.1, 120, turn_id="g-1")
            assert (task.used.cost, task.used.reserved_cost, task.used.tokens) == (0.1, 0.0, 120)
        for _ in range(2):
            task = tasks.record_tokens(who, "p", a.id, 30, turn_id="g-2")
            assert task.used.tokens == 150


def test_loosening_the_money_budget_needs_an_admin(make_app: AppFactory) -> None:
    api = Api(
        make_app(
            limits={"max_cost": 2.0}, policies={"cheap": {"limits": {"max_cost": 0.5}}}
        ).test_client()
    )
    assert Agent(api, policy="cheap").id
    cheap = api.post("/v1/tasks", {"workflow": "wf-sheets", "policy": "cheap"})[1]
    assert cheap["task"]["limits"]["max_cost"] == 0.5
    status, _ = api.post(
        "/v1/tasks", {"workflow": "wf-sheets", "policy": "cheap", "limits": {"max_cost": 1.0}}
    )
    assert status == 403
    status, out = api.post("/v1/tasks", {"workflow": "wf-sheets", "limits": {"max_cost": 5}})
    assert status == 403 and "max_cost" in out["detail"]
    assert Agent(api, limits={"max_cost": 1.5}).id
    status, out = api.post("/v1/tasks", {"workflow": "wf-sheets", "limits": {"max_cost": -1}})
    assert status == 422 and out["errors"][0]["loc"] == ["body", "limits", "max_cost"]


def test_a_caller_given_call_id_is_admitted_once(api: Api) -> None:
    """A call admitted at the model gate and again by a Loop Stop node under the
    same id counts once; its write executes once and is replayed once committed."""
    a = Agent(api, limits={"max_same_call": 1})
    call = {"call_id": "call_Ab12.x:1@gate", "operation_id": "note:c1"}
    first = a.call("create_note", {"n": 1}, kind="write", **call)
    assert (first["decision"], first["call_id"]) == ("execute", "call_Ab12.x:1@gate")
    again = a.call("create_note", {"n": 1}, kind="write", **call)
    # the write is in progress: the ledger still decides (never a second execute)
    assert (again["decision"], again["reason"], again["envelope"]) == ("deny", "in_progress", None)
    status, other = api.post(
        a.base + "/tool-calls",
        {
            "tool": "create_note",
            "kind": "write",
            "args": {"n": 1},
            **call,
            "operation_id": "note:c2",
        },
    )
    assert status == 409, other  # the id named another operation
    used = api.get(a.base)[1]["task"]["used"]
    assert used["tool_calls"] == 1
    out = a.result(first, result={"id": "n1"}, receipt={"id": "n1"})
    assert out["decision"] == "recorded"
    third = a.call("create_note", {"n": 1}, kind="write", **call)
    assert (third["decision"], third["receipt"]) == ("replay", {"id": "n1"})
    status, bad = api.post(
        a.base + "/tool-calls", {"tool": "x", "kind": "read", "call_id": "has space"}
    )
    assert status == 422 and bad["errors"][0]["loc"] == ["body", "call_id"]
    assert api.get(a.base)[1]["task"]["used"]["tool_calls"] == 1
    # the write has its result: another call under its id is a new call (a server
    # that numbers its calls afresh); the same operation with other arguments is
    # then the ledger's conflict, never a second write
    status, clash = api.post(
        a.base + "/tool-calls",
        {"tool": "create_note", "kind": "write", "args": {"n": 2}, **call},
    )
    assert status == 200, clash
    assert (clash["decision"], clash["envelope"]["reason"]) == ("deny", "operation_conflict")


def test_a_caller_given_read_id_counts_once_until_its_result(api: Api) -> None:
    """A read admitted twice under one id before its result is one call; once it
    has its result, the same id in a later proposal is a new call (servers that
    number their calls afresh each turn), under every rule."""
    a = Agent(api, limits={"max_same_call": 2})
    first = a.call("search", {"q": 1}, call_id="call_0")
    assert a.call("search", {"q": 1}, call_id="call_0")["decision"] == "execute"
    assert api.get(a.base)[1]["task"]["used"]["tool_calls"] == 1
    a.result(first, result={"hits": 0})
    second = a.call("search", {"q": 1}, call_id="call_0")
    assert second["decision"] == "execute"
    assert api.get(a.base)[1]["task"]["used"]["tool_calls"] == 2
    a.result(second, result={"hits": 0})
    ended(a.call("search", {"q": 1}, call_id="call_0"), "partial", "same_call")


def test_initial_revision_and_the_evidence_vocabulary(api: Api) -> None:
    """A task starts at its initial_revision: evidence at it is idle, below it is
    invalid. ``effect`` takes none / committed / not_committed / unknown."""
    a = Agent(api, initial_revision=7, limits={"max_idle": 2})
    assert api.get(a.base)[1]["task"]["validated_revision"] == 7
    out = a.result(
        a.call("get", {"id": 1}), result={"v": 1}, evidence={"revision": 7, "effect": "none"}
    )
    assert out["decision"] == "recorded" and out["task"]["used"]["idle"] == 1
    out = a.result(a.call("get", {"id": 2}), result={"v": 2}, evidence={"revision": 8})
    assert out["task"]["validated_revision"] == 8 and out["task"]["used"]["idle"] == 0
    ended(
        a.result(a.call("get", {"id": 3}), result={}, evidence={"revision": 6}),
        "blocked",
        "invalid_evidence",
    )
    b = Agent(api)
    out = b.result(b.call("get", {"id": 1}), result={}, evidence={"effect": "committed"})
    ended(out, "blocked", "invalid_evidence")
    c = Agent(api)
    w = c.call("send", {"to": "x"}, kind="write", operation_id="mail:u1")
    out = c.result(w, "ok", receipt={"id": 1}, evidence={"effect": "unknown"})
    ended(out, "needs_reconciliation", "unknown_commit")
    assert out["envelope"]["uncertain_operations"] == ["mail:u1"]
    assert (
        api.get("/v1/operations/mail:u1", workflow="wf-sheets")[1]["operation"]["state"]
        == "unknown"
    )
    d = Agent(api)
    w = d.call("send", {"to": "y"}, kind="write", operation_id="mail:n1")
    ended(
        d.result(w, "ok", receipt={"id": 2}, evidence={"effect": "none"}),
        "blocked",
        "invalid_evidence",
    )
    status, out = api.post("/v1/tasks", {"workflow": "wf-sheets", "initial_revision": -1})
    assert status == 422 and out["errors"][0]["loc"] == ["body", "initial_revision"]


def test_outlier_stop(make_app: AppFactory) -> None:
    """``outliers.action: stop`` ends a runaway task (more: tests/api/tasks/test_outliers.py)."""
    api = Api(make_app(outliers={"min_tasks": 1, "action": "stop"}).test_client())
    normal = Agent(api)
    normal.model(tokens_used=100)
    normal.post("/complete", {"evidence": {"done": True}})
    runaway = Agent(api)
    ended(runaway.model(tokens_used=501), "stopped", "outlier")


def test_invalid_call_through_the_model_gate(make_app: AppFactory) -> None:
    """``invalid_call`` is the gate's: a write whose operation id template finds no
    value in the proposed call (tests/api/model_gate/test_gate_writes.py has the rest)."""
    from fake_llm import serve

    tool = {"kind": "write", "operation_id": "crm-lead:{contact.email}"}
    with serve() as llm:
        gate = {"upstream_url": llm.base, "default_model": "m", "timeout_s": 5}
        api = Api(make_app(model_gate=gate, tools={"create_lead": tool}).test_client())
        body = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "loopstop-task-key: invalid-call-1"},
                {"role": "user", "content": "a@b.c"},
            ],
            "tools": [{"type": "function", "function": {"name": "create_lead"}}],
        }
        status, _ = api.post("/v1/openai/chat/completions", body)
        assert status == 200
    status, out = api.post("/v1/tasks", {"task_key": "invalid-call-1"})
    ended(out, "blocked", "invalid_call")
    REACHED.add("invalid_call")


SCENARIOS = TESTS / "scenarios"


def test_every_terminal_reason_is_reached_through_http() -> None:
    """Runs last in this module: the reasons reached above plus the task scenarios."""
    reached = set(REACHED)
    for path in SCENARIOS.glob("task-*.json"):
        text = path.read_text()
        reached |= {r.value for r in EndReason if f'"reason": "{r.value}"' in text}
    missing = {r.value for r in EndReason} - reached
    assert not missing, missing
    assert json.dumps(sorted(reached))


@pytest.mark.all_stores  # a race on the store
def test_concurrent_admissions_never_overshoot_the_budget(make_app: AppFactory) -> None:
    """The budget is consumed when a call is admitted, not when its result comes."""
    app = make_app()
    api = Api(app.test_client())
    a = Agent(api, token=ADMIN_TOKEN, limits={"max_tool_calls": 5, "max_same_call": 100})
    decisions = admit_at_once((app,), a.base, 32)
    assert decisions.count("execute") == 5 and decisions.count("deny") == 27
    task = api.get(a.base)[1]
    assert task["task"]["used"]["tool_calls"] == 5
    assert task["envelope"]["reason"] == "tool_budget"


@pytest.mark.all_stores  # a race on the store
def test_concurrent_reservations_never_overspend_the_money_budget(make_app: AppFactory) -> None:
    """Reservations live in the task's one document: 16 turns at once, each
    reserving 0.1 of a 0.5 budget, admit exactly 5."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sidecar.auth import Principal

    app = make_app()
    api = Api(app.test_client())
    a = Agent(api, token=ADMIN_TOKEN, limits={"max_cost": 0.5, "max_model_calls": 100})
    tasks = app.extensions["loopstop"].tasks
    who = Principal("n8n", None, False)
    barrier = threading.Barrier(16)

    def turn(_: int) -> bool:
        barrier.wait()
        return bool(tasks.model_call(who, "p", a.id, None, reserve_cost=0.1)[1].admitted)

    with ThreadPoolExecutor(16) as pool:
        admitted = list(pool.map(turn, range(16)))
    assert admitted.count(True) == 5
    task = api.get(a.base)[1]
    assert task["task"]["used"]["reserved_cost"] == 0.5
    assert task["envelope"]["reason"] == "cost_budget"
