"""The ledger through the HTTP API, on every store: every row of DESIGN §1,
fencing, reconciliation, the queue, scopes and the test namespace."""

from __future__ import annotations

from typing import Any

from conftest import ADMIN_TOKEN, N8N_TOKEN, SCOPED_TOKEN, Api, AppFactory, Clock

OP = "/v1/operations"


def commit(api: Api, op_id: str, attempt: int, receipt: Any, **kw: Any) -> tuple[int, Any]:
    return api.post(f"{OP}/{op_id}/commit", {"attempt": attempt, "receipt": receipt, **kw})


def fail(api: Api, op_id: str, attempt: int, outcome: str, **kw: Any) -> tuple[int, Any]:
    return api.post(f"{OP}/{op_id}/fail", {"attempt": attempt, "outcome": outcome, **kw})


def reconcile(
    api: Api, op_id: str, outcome: str, token: str = "default", **kw: Any
) -> tuple[int, Any]:
    body = {"outcome": outcome, "evidence": {"checked": "crm"}, **kw}
    return api.post(f"{OP}/{op_id}/reconcile", body, token=token)


# -- the table, row by row ----------------------------------------------------


def test_row_none_executes(api: Api) -> None:
    out = api.begin("order-42-v3", {"order": 42}, workflow="wf-crm", lease_s=30)
    assert out["decision"] == "execute" and out["reason"] == "new"
    op = out["operation"]
    assert (op["state"], op["attempt"], op["workflow"]) == ("in_progress", 1, "wf-crm")
    assert op["lease_expires_at"].endswith("Z") and "payload" not in op


def test_row_different_payload_conflicts_and_changes_nothing(api: Api) -> None:
    api.begin("order-42", {"order": 42, "status": "confirmed"})
    out = api.begin("order-42", {"order": 42, "status": "cancelled"})
    assert out["decision"] == "conflict" and out["reason"] == "payload_mismatch"
    status, got = api.get(f"{OP}/order-42")
    assert status == 200 and got["operation"]["attempt"] == 1
    assert got["operation"]["state"] == "in_progress"


def test_row_same_payload_live_lease_is_in_progress(api: Api, clock: Clock) -> None:
    api.begin("o", {"a": 1}, lease_s=60)
    clock.advance(59)
    assert api.begin("o", {"a": 1.0})["decision"] == "in_progress"


def test_row_lease_expired_becomes_unknown_then_reconcile(api: Api, clock: Clock) -> None:
    api.begin("o", {"a": 1}, lease_s=60)
    clock.advance(60)
    out = api.begin("o", {"a": 1})
    assert (out["decision"], out["reason"]) == ("reconcile", "lease_expired")
    assert out["operation"]["state"] == "unknown"
    assert api.begin("o", {"a": 1})["decision"] == "reconcile"


def test_row_committed_replays_receipt_and_result(api: Api) -> None:
    api.begin("o", {"b": [1, 2], "a": "x"})
    status, _ = commit(api, "o", 1, {"id": "crm-7"}, result={"url": "https://crm/7"})
    assert status == 200
    out = api.begin("o", {"a": "x", "b": [1.0, 2.0]})  # key order and 1.0 == 1
    assert out["decision"] == "replay"
    assert out["operation"]["receipt"] == {"id": "crm-7"}
    assert out["operation"]["result"] == {"url": "https://crm/7"}


def test_row_not_committed_retries_then_exhausted(make_app: AppFactory) -> None:
    api = Api(make_app(operations={"max_attempts": 2}).test_client())
    assert api.begin("o")["operation"]["attempt"] == 1
    assert fail(api, "o", 1, "not_committed", detail="HTTP 400")[0] == 200
    out = api.begin("o")
    assert (out["decision"], out["reason"]) == ("execute", "retry_after_not_committed")
    assert out["operation"]["attempt"] == 2
    assert fail(api, "o", 2, "not_committed")[0] == 200
    out = api.begin("o")
    assert (out["decision"], out["reason"]) == ("exhausted", "max_attempts")
    assert api.get(f"{OP}/o")[1]["operation"]["attempt"] == 2


def test_row_unknown_is_reconcile_forever(api: Api, clock: Clock) -> None:
    api.begin("o")
    fail(api, "o", 1, "unknown", detail="timeout after 30 s")
    for _ in range(3):
        clock.advance(86_400)
        assert api.begin("o")["decision"] == "reconcile"


# -- commit, fail, reconcile ---------------------------------------------------


def test_commit_repeat_same_receipt_noop_other_receipt_409(api: Api) -> None:
    api.begin("o")
    assert commit(api, "o", 1, "r-1")[0] == 200
    status, body = commit(api, "o", 1, "r-1")
    assert status == 200 and body["operation"]["receipt"] == "r-1"
    status, body = commit(api, "o", 1, "r-2")
    assert status == 409 and body["type"].endswith("state-conflict")
    assert body["operation"]["receipt"] == "r-1"


def test_fencing_late_answers_of_a_superseded_attempt_are_409(api: Api, clock: Clock) -> None:
    api.begin("o", lease_s=10)
    clock.advance(11)
    assert api.begin("o")["decision"] == "reconcile"
    assert reconcile(api, "o", "not_committed")[0] == 200
    second = api.begin("o")
    assert second["decision"] == "execute" and second["operation"]["attempt"] == 2
    for late in (lambda: fail(api, "o", 1, "unknown"), lambda: commit(api, "o", 1, "late")):
        status, body = late()
        assert status == 409 and body["type"].endswith("stale-attempt")
        assert body["operation"]["attempt"] == 2 and body["operation"]["state"] == "in_progress"
    assert commit(api, "o", 2, "r-2")[0] == 200
    assert api.begin("o")["operation"]["receipt"] == "r-2"


def test_reconcile_records_evidence_and_actor(api: Api) -> None:
    api.begin("o", workflow="wf-crm")
    fail(api, "o", 1, "unknown", workflow="wf-crm")
    status, body = reconcile(
        api,
        "o",
        "committed",
        token=ADMIN_TOKEN,
        workflow="wf-crm",
        receipt="crm-1",
        evidence={"lookup": "GET /deals?ref=o", "found": 1},
    )
    assert status == 200
    rec = body["operation"]["reconciliation"]
    assert rec["actor"] == "operator" and rec["outcome"] == "committed"
    assert rec["evidence"] == {"lookup": "GET /deals?ref=o", "found": 1}
    assert api.begin("o", workflow="wf-crm")["decision"] == "replay"


def test_reconcile_needs_evidence_and_refuses_live_lease(api: Api) -> None:
    api.begin("o")
    status, body = api.post(f"{OP}/o/reconcile", {"outcome": "committed"})
    assert status == 422 and body["errors"][0]["loc"] == ["body", "evidence"]
    status, body = api.post(f"{OP}/o/reconcile", {"outcome": "committed", "evidence": None})
    assert status == 422
    status, body = reconcile(api, "o", "committed")
    assert status == 409


def test_commit_or_reconcile_unknown_operation_is_404(api: Api) -> None:
    status, body = commit(api, "nope", 1, "r")
    assert status == 404 and body["type"].endswith("not-found")
    assert reconcile(api, "nope", "committed")[0] == 404
    assert api.get(f"{OP}/nope")[0] == 404


# -- the reconciliation queue -------------------------------------------------


def test_queue_lists_unknown_and_expired_leases_paginated(api: Api, clock: Clock) -> None:
    for i in range(5):
        api.begin(f"o{i}", workflow="wf-a" if i % 2 else "wf-b", lease_s=10)
        clock.advance(1)
    fail(api, "o0", 1, "unknown", workflow="wf-b")
    commit(api, "o1", 1, "r", workflow="wf-a")
    status, page = api.get(OP, state="unknown")
    assert status == 200 and [o["operation_id"] for o in page["items"]] == ["o0"]
    status, page = api.get(OP, state="in_progress")
    assert [o["operation_id"] for o in page["items"]] == ["o2", "o3", "o4"]
    clock.advance(60)  # every lease ran out: all open operations are unknown now
    seen, cursor = [], None
    while True:
        query = {"state": "unknown", "limit": 2, **({"cursor": cursor} if cursor else {})}
        status, page = api.get(OP, **query)
        assert status == 200
        seen += [o["operation_id"] for o in page["items"]]
        assert all(o["state"] == "unknown" for o in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == ["o0", "o2", "o3", "o4"]
    status, page = api.get(OP, state="unknown", workflow="wf-b")
    assert sorted(o["operation_id"] for o in page["items"]) == ["o0", "o2", "o4"]
    reconcile(api, "o2", "committed", receipt="r", workflow="wf-b")
    status, page = api.get(OP, state="unknown", workflow="wf-b")
    assert sorted(o["operation_id"] for o in page["items"]) == ["o0", "o4"]


def test_queue_rejects_bad_cursor_and_state(api: Api) -> None:
    status, body = api.get(OP, cursor="!!!")
    assert status == 422 and body["errors"][0]["loc"] == ["query", "cursor"]
    status, body = api.get(OP, state="committed")
    assert status == 422 and body["errors"][0]["loc"] == ["query", "state"]


# -- scopes ---------------------------------------------------------------------


def test_scoped_token_never_reaches_another_workflow(api: Api, clock: Clock) -> None:
    api.begin("crm-op", workflow="wf-crm")
    scoped = Api(api.client, SCOPED_TOKEN)
    for status, body in (
        scoped.post(f"{OP}/crm-op/begin", {"payload": {"x": 1}, "workflow": "wf-crm"}),
        scoped.post(f"{OP}/crm-op/begin", {"payload": {"x": 1}}),
        scoped.post(f"{OP}/crm-op/commit", {"attempt": 1, "receipt": "r", "workflow": "wf-crm"}),
        scoped.get(f"{OP}/crm-op", workflow="wf-crm"),
        scoped.get(OP, workflow="wf-crm"),
    ):
        assert status == 403, body
        assert body["type"].endswith("forbidden")
    # In its own namespace the id is another operation's: absent (404), never 403,
    # and the same answer as for an id nobody holds.
    for path, extra in (
        ("commit", {"attempt": 1, "receipt": "r"}),
        ("fail", {"attempt": 1, "outcome": "unknown"}),
        ("reconcile", {"outcome": "committed", "evidence": 1}),
    ):
        for op_id in ("crm-op", "nobody-op"):
            status, body = scoped.post(f"{OP}/{op_id}/{path}", extra)
            assert (
                status == 404
                and body["detail"] == f"no operation {op_id!r} in workflow 'wf-sheets'"
            )
    assert scoped.get(f"{OP}/crm-op")[0] == 404
    status, body = scoped.post(f"{OP}/new-op/begin", {"payload": 1})
    assert status == 403  # a scoped token must name its workflow
    assert api.get(f"{OP}/crm-op", workflow="wf-crm")[1]["operation"]["state"] == "in_progress"
    assert api.get(f"{OP}/new-op")[0] == 404
    out = scoped.begin("sheet-op", workflow="wf-sheets")
    assert out["decision"] == "execute"
    clock.advance(3600)
    status, page = scoped.get(OP, state="unknown")  # its only workflow is implied
    assert status == 200 and [o["operation_id"] for o in page["items"]] == ["sheet-op"]


def test_reconcile_by_scoped_token_of_the_operations_workflow(api: Api) -> None:
    scoped = Api(api.client, SCOPED_TOKEN)
    scoped.begin("sheet-op", workflow="wf-sheets")
    fail(scoped, "sheet-op", 1, "unknown")
    status, body = reconcile(scoped, "sheet-op", "not_committed")
    assert status == 200 and body["operation"]["reconciliation"]["actor"] == "sheets-only"


def test_one_id_in_two_workflows_is_two_operations(api: Api) -> None:
    api.begin("o", {"a": 1}, workflow="wf-a")
    commit(api, "o", 1, "r-a", workflow="wf-a")
    for other in ({"workflow": "wf-b"}, {}):
        out = api.begin("o", {"a": 1}, **other)
        assert (out["decision"], out["reason"]) == ("execute", "new")
    assert api.begin("o", {"a": 1}, workflow="wf-a")["decision"] == "replay"
    # The shared namespace holds one operation for every workflow: another one's is a conflict.
    api.begin("s", {"a": 1}, workflow="wf-a", scope="shared")
    out = api.begin("s", {"a": 1}, workflow="wf-b", scope="shared")
    assert (out["decision"], out["reason"]) == ("conflict", "workflow_mismatch")


def test_foreign_record_is_not_found_and_not_named(api: Api) -> None:
    api.begin("payroll-run", workflow="payroll-secret")
    status, body = Api(api.client, SCOPED_TOKEN).get(f"{OP}/payroll-run")
    assert status == 404 and "payroll-secret" not in body["detail"]


def test_whoami_per_token(api: Api) -> None:
    assert api.get("/v1/whoami")[1] == {
        "name": "n8n",
        "workflows": ["*"],
        "admin": False,
        "authenticated": True,
    }
    assert api.get("/v1/whoami", token=ADMIN_TOKEN)[1]["admin"] is True
    assert api.get("/v1/whoami", token=SCOPED_TOKEN)[1]["workflows"] == ["wf-sheets"]
    status, body = api.get("/v1/whoami", token="wrong-token")
    assert status == 401 and body["type"].endswith("unauthenticated")
    status, body = api.get("/v1/whoami", token=None)
    assert status == 401


# -- the test namespace -------------------------------------------------------


def test_test_mode_lives_in_its_own_namespace(api: Api) -> None:
    api.begin("o", {"a": 1}, execution_mode="test")
    commit(api, "o", 1, "test-receipt", execution_mode="test")
    prod = api.begin("o", {"a": 1}, execution_mode="production")
    assert prod["decision"] == "execute" and prod["operation"]["execution_mode"] == "production"
    again = api.begin("o", {"a": 1}, execution_mode="test")
    assert again["decision"] == "replay" and again["operation"]["receipt"] == "test-receipt"
    assert api.get(f"{OP}/o", execution_mode="test")[1]["operation"]["state"] == "committed"
    assert api.get(f"{OP}/o")[1]["operation"]["state"] == "in_progress"


def test_token_value_compared_exactly(api: Api) -> None:
    for bad in (N8N_TOKEN[:-1], N8N_TOKEN + "x", N8N_TOKEN.upper()):
        assert api.get("/v1/whoami", token=bad)[0] == 401
    status, _ = (
        api.client.get("/v1/whoami", headers={"Authorization": f"Basic {N8N_TOKEN}"}).status_code,
        None,
    )
    assert status == 401


def test_the_decision_log_names_the_execution_of_every_guarded_write(
    api: Api, clock: Clock, caplog: Any
) -> None:
    """begin, commit, fail and reconcile lines carry the n8n execution that sent them, so an
    operator can match a ``reconcile`` to the execution that lost its commit."""
    import json
    import logging

    caplog.set_level(logging.INFO, logger="loopstop.decisions")
    api.begin("order-7", {"o": 7}, workflow="wf-crm", lease_s=5, execution_id="101")
    commit(api, "order-7", 1, {"id": "crm-7"}, workflow="wf-crm", execution_id="101")
    api.begin("order-8", {"o": 8}, workflow="wf-crm", lease_s=5, execution_id="102")
    fail(api, "order-8", 1, "unknown", workflow="wf-crm", execution_id="102")
    api.begin("order-9", {"o": 9}, workflow="wf-crm", lease_s=5, execution_id="103")
    clock.advance(6)  # the worker of execution 103 died mid-write
    again = api.begin("order-9", {"o": 9}, workflow="wf-crm", execution_id="104")
    assert again["decision"] == "reconcile"
    reconcile(api, "order-9", "not_committed", token=ADMIN_TOKEN, workflow="wf-crm")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "loopstop.decisions"]
    seen = [(x["route"], x["operation_id"], x.get("execution_id")) for x in lines]
    assert seen == [
        ("operations.begin", "order-7", "101"),
        ("operations.commit", "order-7", "101"),
        ("operations.begin", "order-8", "102"),
        ("operations.fail", "order-8", "102"),
        ("operations.begin", "order-9", "103"),
        ("operations.begin", "order-9", "104"),
        ("operations.reconcile", "order-9", None),
    ]
