"""The ledger against the first hardening's attack (items 4 to 8): unknown writes leave
only through the system of record, operation ids live in their workflow's namespace,
open operations are bounded and visible (DESIGN §1)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from system_of_record import SystemOfRecord, scoped_checks, serve
from ui_session import login

from conftest import N8N_TOKEN, SCOPED_TOKEN, SECRET, Api, AppFactory, Clock
from sidecar.store import Plan, Snapshot, Store, Write

OP = "/v1/operations"


@pytest.fixture(scope="module")
def sor() -> Iterator[SystemOfRecord]:
    with serve() as data:
        yield data


def problem(status: int, body: Any, slug: str) -> None:
    assert isinstance(body, dict) and body.get("status") == status, body
    assert str(body["type"]).endswith(slug), body


def begin(api: Api, op_id: str, **fields: Any) -> dict[str, Any]:
    return api.begin(op_id, {"x": 1}, **fields)


pytestmark = pytest.mark.security


# -- 4, 5, 6. unknown writes leave only through the system of record ------------


def test_fail_after_unknown_is_409_and_the_write_stays_unknown(api: Api, clock: Clock) -> None:
    begin(api, "w", workflow="wf")
    status, _ = api.post(f"{OP}/w/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf"})
    assert status == 200
    status, body = api.post(
        f"{OP}/w/fail", {"attempt": 1, "outcome": "not_committed", "workflow": "wf"}
    )
    problem(409, body, "state-conflict")
    assert begin(api, "w", workflow="wf")["decision"] == "reconcile"
    # An expired lease is unknown too: a late "not committed" cannot settle it.
    begin(api, "w2", workflow="wf", lease_s=10)
    clock.advance(11)
    status, body = api.post(
        f"{OP}/w2/fail", {"attempt": 1, "outcome": "not_committed", "workflow": "wf"}
    )
    problem(409, body, "state-conflict")
    assert begin(api, "w2", workflow="wf")["decision"] == "reconcile"


def test_the_reserving_begins_reconcile_check_is_the_one_used(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    api = Api(make_app(checks=scoped_checks(sor.base)).test_client())
    sor.charges["ch-real"] = {"status": "succeeded"}
    spec = {"check": "charge_found", "input": {"ref": "ch-real"}}
    begin(api, "charge:1", workflow="wf-pay", reconcile=spec)
    api.post(f"{OP}/charge:1/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf-pay"})
    # A later begin names a record that is not there: it would "prove" the write absent.
    other = {"check": "charge_found", "input": {"ref": "ch-nowhere"}}
    out = begin(api, "charge:1", workflow="wf-pay", reconcile=other)
    assert (out["decision"], out["reason"]) == ("replay", "reconciled_committed")
    assert out["operation"]["reconciliation"]["evidence"]["url"].endswith("/charges/ch-real")


@pytest.mark.parametrize("check", ["answer_shape", "receipts", "any_mixed"])
def test_only_checks_asking_the_system_of_record_may_reconcile(
    make_app: AppFactory, sor: SystemOfRecord, check: str
) -> None:
    api = Api(make_app(checks=scoped_checks(sor.base)).test_client())
    _, body = api.post(f"{OP}/o/begin", {"payload": 1, "reconcile": {"check": check, "input": {}}})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "reconcile", "check"]
    assert api.get(f"{OP}/o")[0] == 404  # nothing was reserved
    for asking in ("charge_found", "all_asks"):
        out = api.begin(f"o-{asking}", 1, reconcile={"check": asking, "input": {"ref": "x"}})
        assert out["decision"] == "execute"


@pytest.mark.slow  # runs the CLI in a process
def test_check_config_refuses_a_write_tool_whose_check_asks_nothing(tmp_path: Path) -> None:
    config = tmp_path / "loopstop.yaml"
    config.write_text(
        "checks:\n"
        "  shape: {kind: json_schema, schema: {type: object}}\n"
        "  found: {kind: http, url: 'http://crm.internal/deals/{id}'}\n"
        "tools:\n"
        "  update_deal: {kind: write, check: shape}\n"
        "  read_deal: {kind: read, check: shape}\n"
        "  create_deal: {kind: write, check: found}\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config"],
        env={"LOOPSTOP_CONFIG": str(config), "LOOPSTOP_SECRET": "s" * 32, "PATH": "/usr/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "tools.update_deal.check" in run.stderr and "system of record" in run.stderr
    assert "read_deal" not in run.stderr and "create_deal" not in run.stderr


# -- 7. operation ids live in their workflow's namespace -------------------------


def test_a_scoped_token_is_never_blocked_by_another_workflows_id(api: Api) -> None:
    begin(api, "invoice:7", workflow="wf-crm")
    scoped = Api(api.client, SCOPED_TOKEN)
    out = begin(scoped, "invoice:7", workflow="wf-sheets")
    assert (out["decision"], out["operation"]["workflow"]) == ("execute", "wf-sheets")
    # Its single workflow is implied on the routes naming the operation.
    status, body = scoped.post(f"{OP}/invoice:7/commit", {"attempt": 1, "receipt": "s-1"})
    assert status == 200 and body["operation"]["workflow"] == "wf-sheets"
    crm = api.get(f"{OP}/invoice:7", workflow="wf-crm")[1]["operation"]
    assert (crm["state"], crm["receipt"]) == ("in_progress", None)
    # Not there and someone else's: one answer, naming nobody else's workflow.
    begin(api, "payroll:1", workflow="wf-payroll")
    foreign = scoped.get(f"{OP}/payroll:1")
    absent = scoped.get(f"{OP}/payroll:2")
    assert foreign[0] == absent[0] == 404
    assert foreign[1]["detail"].replace("payroll:1", "ID") == absent[1]["detail"].replace(
        "payroll:2", "ID"
    )
    assert "wf-payroll" not in json.dumps(foreign[1])


def test_the_shared_namespace_needs_a_token_holding_every_workflow(api: Api) -> None:
    scoped = Api(api.client, SCOPED_TOKEN)
    status, body = scoped.post(
        f"{OP}/global:1/begin", {"payload": 1, "workflow": "wf-sheets", "scope": "shared"}
    )
    problem(403, body, "forbidden")
    out = api.begin("global:1", 1, workflow="wf-a", scope="shared")
    assert out["decision"] == "execute"
    assert api.begin("global:1", 1, workflow="wf-b", scope="shared")["decision"] == "conflict"
    # The routes find it by its workflow.
    status, body = api.post(
        f"{OP}/global:1/commit", {"attempt": 1, "receipt": "g", "workflow": "wf-a"}
    )
    assert status == 200
    assert api.begin("global:1", 1, workflow="wf-a")["decision"] == "replay"


@pytest.mark.all_stores  # a record in the old layout, per store
def test_a_record_made_before_namespaces_is_still_replayed(api: Api, store: Store) -> None:
    """A committed write stored under the id alone (the old layout) must not run again."""
    doc = {
        "operation_id": "legacy:1",
        "state": "committed",
        "attempt": 1,
        "fingerprint": "",
        "secret_id": "",
        "workflow": "wf-old",
        "task_id": None,
        "chain_id": None,
        "created_at": 1.0,
        "updated_at": 1.0,
        "receipt": {"id": "r-1"},
    }
    # The fingerprint of {"x": 1} under the current secret, taken from a real record.
    api.begin("legacy:probe", {"x": 1}, workflow="wf-old")
    stored = store.get("p:op:wf-old/legacy:probe")
    assert stored is not None
    doc.update(fingerprint=stored["fingerprint"], secret_id=stored["secret_id"])

    def plant(snap: Snapshot) -> Plan[None]:
        snap.get("p:op:legacy:1")
        plan: Plan[None] = Plan(None)
        plan.writes["p:op:legacy:1"] = Write(doc)
        return plan

    store.transact(["p:op:legacy:1"], plant)
    out = api.begin("legacy:1", {"x": 1}, workflow="wf-old")
    assert (out["decision"], out["operation"]["receipt"]) == ("replay", {"id": "r-1"})
    assert begin(api, "legacy:1", workflow="wf-other")["decision"] == "execute"


def test_a_tasks_write_lives_in_the_tasks_workflow_namespace(api: Api) -> None:
    task = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]["task"]["task_id"]
    call = api.post(
        f"/v1/tasks/{task}/tool-calls",
        {"tool": "send", "kind": "write", "args": {"to": "a"}, "operation_id": "mail:9"},
    )[1]
    assert call["decision"] == "execute"
    assert api.get(f"{OP}/mail:9", workflow="wf-agent")[1]["operation"]["task_id"] == task
    assert api.get(f"{OP}/mail:9")[0] == 404  # not in the shared namespace
    assert begin(api, "mail:9", workflow="wf-other")["decision"] == "execute"


# -- 8. open operations are bounded and visible ---------------------------------


def test_open_operations_per_workflow_are_bounded(make_app: AppFactory, clock: Clock) -> None:
    app = make_app(operations={"max_open_per_workflow": 3, "lease_s": 30})
    api = Api(app.test_client())
    for i in range(3):
        assert begin(api, f"o{i}", workflow="wf-flood")["decision"] == "execute"
    status, body = api.post(f"{OP}/o3/begin", {"payload": 1, "workflow": "wf-flood"})
    problem(429, body, "too-many-open-operations")
    assert begin(api, "o0", workflow="wf-flood")["decision"] == "in_progress"  # not a new one
    assert begin(api, "o0", workflow="wf-calm")["decision"] == "execute"  # another workflow
    # Expired leases are unknown, in the queue, and still count: they may have landed.
    clock.advance(31)
    status, page = api.get(OP, state="unknown", workflow="wf-flood")
    assert sorted(o["operation_id"] for o in page["items"]) == ["o0", "o1", "o2"]
    metrics = api.client.get("/metrics").get_data(as_text=True)
    assert "loopstop_operations_awaiting_reconciliation 4.0" in metrics
    assert "loopstop_operations_open 4.0" in metrics
    client = app.test_client()
    login(client, N8N_TOKEN)
    page_html = client.get("/ui").get_data(as_text=True)
    assert "4 unknown, 4 open" in page_html and "may hold 3 open" in page_html
    status, body = api.post(f"{OP}/o3/begin", {"payload": 1, "workflow": "wf-flood"})
    assert status == 429
    api.post(
        f"{OP}/o1/reconcile",
        {"outcome": "not_committed", "evidence": {"crm": "none"}, "workflow": "wf-flood"},
    )
    assert begin(api, "o3", workflow="wf-flood")["decision"] == "execute"


def test_a_tasks_writes_count_toward_the_configured_open_bound(make_app: AppFactory) -> None:
    """A write admitted through the task guard is a begin too: the configured
    operations.max_open_per_workflow (not the default) bounds it, and begins
    and task writes share one count per workflow."""
    api = Api(make_app(operations={"max_open_per_workflow": 3}).test_client())
    assert begin(api, "b1", workflow="wf-flood")["decision"] == "execute"
    task = api.post("/v1/tasks", {"workflow": "wf-flood"})[1]["task"]["task_id"]
    base = f"/v1/tasks/{task}"

    def write(op_id: str) -> tuple[int, Any]:
        return api.post(
            base + "/tool-calls",
            {"tool": "send", "kind": "write", "args": {"id": op_id}, "operation_id": op_id},
        )

    for op_id in ("mail:1", "mail:2"):
        status, call = write(op_id)
        assert (status, call["decision"]) == (200, "execute"), call
    status, body = write("mail:3")
    problem(429, body, "too-many-open-operations")
    assert "max_open_per_workflow is 3" in body["detail"]
    assert api.get(f"{OP}/mail:3", workflow="wf-flood")[0] == 404  # nothing reserved
    assert api.get(base)[1]["task"]["used"]["tool_calls"] == 2  # nor counted
    status, body = api.post(f"{OP}/b2/begin", {"payload": 1, "workflow": "wf-flood"})
    problem(429, body, "too-many-open-operations")
    # A write that opens nothing new still gets its answer: the one in progress.
    status, again = write("mail:1")
    assert (status, again["decision"], again["reason"]) == (200, "deny", "in_progress")
    # Settled, there is room again.
    api.post(f"{OP}/b1/commit", {"attempt": 1, "receipt": "r", "workflow": "wf-flood"})
    status, call = write("mail:3")
    assert (status, call["decision"]) == (200, "execute"), call


@pytest.mark.slow  # runs the CLI in a process
@pytest.mark.all_stores  # each store's expiry and purge
def test_purge_and_expiry_never_delete_an_open_or_unknown_operation(
    make_app: AppFactory, store_url: str, clock: Clock, tmp_path: Path
) -> None:
    """Open records carry no expiry (an unknown one may have landed): what a
    retention removes is settled records only, on every store."""
    api = Api(make_app(tokens=False, operations={"retention_s": 120}).test_client(), token=None)
    begin(api, "open", workflow="wf", lease_s=3600)
    begin(api, "unknown", workflow="wf")
    api.post(f"{OP}/unknown/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf"})
    begin(api, "lapsed", workflow="wf", lease_s=10)
    begin(api, "done", workflow="wf")
    api.post(f"{OP}/done/commit", {"attempt": 1, "receipt": "r", "workflow": "wf"})
    clock.advance(11)
    kept = [f"p:op:wf/{i}" for i in ("open", "unknown", "lapsed")]
    if store_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(store_url)
        assert [client.ttl("loopstop:" + k) for k in kept] == [-1, -1, -1]  # never expire
        assert 0 < client.ttl("loopstop:p:op:wf/done") <= 120
    else:
        # Every record that has an expiry is past it; then the operator's purge.
        sql = "UPDATE {}kv SET expires_at = 1 WHERE expires_at IS NOT NULL"
        if store_url.startswith("sqlite"):
            import sqlite3

            with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
                conn.execute(sql.format(""))
        else:
            import psycopg

            with psycopg.connect(store_url, autocommit=True) as pg:
                pg.execute(sql.format("loopstop_"))
        run = subprocess.run(
            [sys.executable, "-m", "sidecar", "purge"],
            env={"LOOPSTOP_STORE": store_url, "LOOPSTOP_SECRET": SECRET, "PATH": "/usr/bin"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0 and "purged 1 expired record" in run.stdout, run
    decisions = [begin(api, i, workflow="wf")["decision"] for i in ("open", "unknown", "lapsed")]
    assert decisions == ["in_progress", "reconcile", "reconcile"]  # none executes again


def test_reconcile_input_or_receipt_over_16_kib_is_413(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    api = Api(make_app(checks=scoped_checks(sor.base)).test_client())
    big = {"ref": "x" * 17_000}
    _, body = api.post(
        f"{OP}/o/begin", {"payload": 1, "reconcile": {"check": "charge_found", "input": big}}
    )
    problem(413, body, "payload-too-large")
    assert api.get(f"{OP}/o")[0] == 404
    begin(api, "o")
    api.post(f"{OP}/o/fail", {"attempt": 1, "outcome": "unknown"})
    _, body = api.post(
        f"{OP}/o/reconcile", {"outcome": "committed", "receipt": big, "evidence": {"a": 1}}
    )
    problem(413, body, "payload-too-large")
    assert api.get(f"{OP}/o")[1]["operation"]["state"] == "unknown"
