"""Ways around the exactly-once core that an attack found (issue "Hardening"),
each through real requests on every store: web pages driving the sidecar,
unknown writes settled without the system of record, ids that cross
workflows, open operations that pile up, unscoped checks, operator-page
sessions, inexact names and numbers, unlogged authentication failures."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from system_of_record import SystemOfRecord, serve
from test_ui import login, login_csrf

from conftest import ADMIN_TOKEN, N8N_TOKEN, SCOPED_TOKEN, SECRET, Api, AppFactory, Clock
from sidecar.app import create_app
from sidecar.store import Plan, Snapshot, Store, Write

OP = "/v1/operations"
AUTH = {"Authorization": f"Bearer {N8N_TOKEN}"}
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def sor() -> Iterator[SystemOfRecord]:
    with serve() as data:
        yield data


def checks(base: str) -> dict[str, Any]:
    return {
        "charge_found": {
            "kind": "http",
            "url": base + "/charges/{ref}",
            "assert": ["status == 'succeeded'"],
            "workflows": ["*"],
        },
        "order_of_orders": {
            "kind": "http",
            "url": base + "/orders/{order_id}",
            "workflows": ["wf-orders"],
        },
        "order_unlisted": {"kind": "http", "url": base + "/orders/{order_id}"},
        "order_open": {"kind": "http", "url": base + "/orders/{order_id}", "workflows": ["*"]},
        "slow": {"kind": "http", "url": base + "/slow/{x}", "timeout_s": 5, "workflows": ["*"]},
        "answer_shape": {"kind": "json_schema", "schema": {"type": "object"}, "workflows": ["*"]},
        "receipts": {"kind": "operations", "operations": "ids", "workflows": ["*"]},
        "all_asks": {"kind": "all", "of": ["answer_shape", "charge_found"], "workflows": ["*"]},
        "any_mixed": {"kind": "any", "of": ["charge_found", "answer_shape"], "workflows": ["*"]},
    }


def problem(status: int, body: Any, slug: str) -> None:
    assert isinstance(body, dict) and body.get("status") == status, body
    assert str(body["type"]).endswith(slug), body


def begin(api: Api, op_id: str, **fields: Any) -> dict[str, Any]:
    return api.begin(op_id, {"x": 1}, **fields)


# -- 2. web pages cannot drive the sidecar -------------------------------------


@pytest.fixture
def open_app(make_app: AppFactory) -> Flask:
    """No tokens: loopback only (the test client calls from 127.0.0.1, Host localhost)."""
    return make_app(tokens=False)


def test_cross_site_form_cannot_reconcile_stop_or_resume(open_app: Flask) -> None:
    api = Api(open_app.test_client(), token=None)
    begin(api, "mail:1", workflow="wf-mail")
    api.post(f"{OP}/mail:1/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf-mail"})
    client = open_app.test_client()
    form = {"outcome": "not_committed", "evidence": "x", "workflow": "wf-mail"}
    # A form posted from another site carries its Origin: refused.
    r = client.post(f"{OP}/mail:1/reconcile", data=form, headers={"Origin": EVIL})
    problem(403, r.get_json(), "foreign-origin")
    # A form or simple fetch whose Origin a browser hides (privacy settings): not JSON.
    r = client.post(f"{OP}/mail:1/reconcile", data=form)
    problem(415, r.get_json(), "unsupported-media-type")
    r = client.post("/v1/workflows/wf-mail/stop", data="reason=pwned", content_type="text/plain")
    problem(415, r.get_json(), "unsupported-media-type")
    r = client.post(
        "/v1/workflows/wf-mail/resume",
        data='{"reason": "x"}',
        content_type="text/plain",
        headers={"Origin": "null"},
    )
    assert r.status_code in (403, 415)
    # Nothing changed: the write is still unknown, never executed again.
    out = begin(api, "mail:1", workflow="wf-mail")
    assert out["decision"] == "reconcile"
    assert api.get("/v1/workflows/wf-mail")[1]["stopped"] is None
    # The server's own origin with JSON is served.
    r = client.post(
        "/v1/workflows/wf-mail/stop",
        json={"reason": "operator"},
        headers={"Origin": "http://localhost"},
    )
    assert r.status_code == 200, r.get_json()


def test_dns_rebinding_host_is_refused_without_tokens(open_app: Flask) -> None:
    client = open_app.test_client()
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.nip.io", "10.0.0.5"):
        r = client.get(f"{OP}?state=unknown", headers={"Host": host})
        problem(421, r.get_json(), "misdirected-request")
        assert client.get("/ui", headers={"Host": host}).status_code == 421
    for host in ("localhost", "127.0.0.1:8765", "[::1]:8765"):
        assert client.get(f"{OP}?state=unknown", headers={"Host": host}).status_code == 200


def test_without_tokens_no_route_answers_a_foreign_host(open_app: Flask) -> None:
    """A rebinding page reads nothing either: metrics, readiness, the API document."""
    client = open_app.test_client()
    for path in ("/metrics", "/readyz", "/healthz", "/openapi.json"):
        r = client.get(path, headers={"Host": "evil.example"})
        assert r.status_code == 421, (path, r.status_code)
        problem(421, r.get_json(), "misdirected-request")
        assert client.get(path, headers={"Host": "127.0.0.1:8765"}).status_code == 200, path


def test_with_tokens_the_host_is_free_but_the_origin_is_not(make_app: AppFactory) -> None:
    client = make_app().test_client()
    r = client.get("/v1/whoami", headers={**AUTH, "Host": "loopstop.internal:8765"})
    assert r.status_code == 200
    r = client.post(f"{OP}/o/begin", json={"payload": 1}, headers={**AUTH, "Origin": EVIL})
    problem(403, r.get_json(), "foreign-origin")
    r = client.post(
        f"{OP}/o/begin",
        json={"payload": 1},
        headers={**AUTH, "Host": "ls.example:443", "Origin": "http://ls.example:443"},
    )
    assert r.status_code == 200


def test_model_gate_keeps_working_for_an_openai_client(make_app: AppFactory) -> None:
    """n8n's OpenAI client sends JSON with no Origin: it passes the web-page rules
    (here it reaches the gate, which has no upstream configured)."""
    client = make_app().test_client()
    r = client.post(
        "/v1/openai/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={**AUTH, "User-Agent": "OpenAI/JS 4.0"},
    )
    assert r.get_json()["type"].endswith("model-gate-not-configured"), r.get_json()


def test_ui_cannot_be_framed_and_needs_csrf_without_tokens(open_app: Flask) -> None:
    client = open_app.test_client()
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    r = client.post("/ui/workflows", data={"workflow": "wf-x", "reason": "r"})
    assert r.status_code == 403  # no CSRF token: refused even without tokens
    assert Api(client, token=None).get("/v1/workflows/wf-x")[1]["stopped"] is None
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui").get_data(as_text=True))
    assert csrf
    r = client.post(
        "/ui/workflows", data={"workflow": "wf-x", "reason": "r", "csrf": csrf.group(1)}
    )
    assert r.status_code == 303


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
    api = Api(make_app(checks=checks(sor.base)).test_client())
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
    api = Api(make_app(checks=checks(sor.base)).test_client())
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
    api = Api(make_app(checks=checks(sor.base)).test_client())
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


# -- 10. checks are scoped and bounded ------------------------------------------


def test_a_scoped_token_cannot_tell_an_absent_check_from_a_closed_one(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    """Running a check, or naming it as a begin's reconcile check, answers a
    scoped token the same for a check outside its workflows and for no check at
    all: nothing says it exists or what it asks."""
    api = Api(make_app(checks=checks(sor.base)).test_client())
    scoped = Api(api.client, SCOPED_TOKEN)
    answers = []
    for name in ("order_unlisted", "no_such_check"):
        status, body = scoped.post(f"/v1/checks/{name}", {"input": {"order_id": "ORD-1"}})
        answers.append((status, body["detail"].replace(name, "<name>")))
    assert answers[0] == answers[1] and answers[0][0] == 403, answers
    answers = []
    for name in ("order_unlisted", "no_such_check"):
        status, body = scoped.post(
            f"/v1/operations/op-{name}/begin",
            {"payload": {"n": 1}, "workflow": "wf-sheets", "reconcile": {"check": name}},
        )
        answers.append((status, body["detail"].replace(name, "<name>")))
    assert answers[0] == answers[1] and answers[0][0] == 403, answers
    assert api.post("/v1/checks/no_such_check", {"input": {}})[0] == 404  # every workflow


def test_a_scoped_token_lists_only_the_checks_it_may_run(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    api = Api(make_app(checks=checks(sor.base)).test_client())
    scoped = Api(api.client, SCOPED_TOKEN)
    status, body = scoped.get("/v1/checks")
    assert status == 200
    listed = {c["name"] for c in body["checks"]}
    assert "order_open" in listed
    assert not listed & {"order_of_orders", "order_unlisted"}  # never learned of
    status, body = api.get("/v1/checks")
    assert {"order_open", "order_of_orders", "order_unlisted"} <= {
        c["name"] for c in body["checks"]
    }


def test_a_scoped_token_outside_a_checks_workflows_fetches_nothing(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    api = Api(make_app(checks=checks(sor.base)).test_client())
    scoped = Api(api.client, SCOPED_TOKEN)
    before = len(sor.seen_auth)
    for name in ("order_of_orders", "order_unlisted"):
        status, body = scoped.post(f"/v1/checks/{name}", {"input": {"order_id": "ORD-1"}})
        problem(403, body, "forbidden")
    assert len(sor.seen_auth) == before  # the system of record was never asked
    status, body = scoped.post("/v1/checks/order_open", {"input": {"order_id": "ORD-1"}})
    assert status == 200 and body["passed"] is True
    status, body = api.post("/v1/checks/order_unlisted", {"input": {"order_id": "ORD-1"}})
    assert status == 200  # a token holding every workflow may run any check
    assert len(sor.seen_auth) == before + 2


def test_outside_calls_are_bounded_then_503(make_app: AppFactory, sor: SystemOfRecord) -> None:
    app = make_app(checks=checks(sor.base), http={"checks_concurrency": 1, "checks_wait_s": 0.2})
    results: list[int] = []
    started = threading.Barrier(2)

    def run() -> None:
        client = app.test_client()
        started.wait()
        r = client.post("/v1/checks/slow", json={"input": {"x": 1}}, headers=AUTH)
        results.append(r.status_code)
        if r.status_code == 503:
            problem(503, r.get_json(), "checks-busy")

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [200, 503]


# -- 13. operator-page sessions -------------------------------------------------


def test_logout_revokes_the_session_everywhere(make_app: AppFactory) -> None:
    app = make_app()
    client = app.test_client()
    login(client, ADMIN_TOKEN)
    cookie = client.get_cookie("loopstop_session")
    assert cookie is not None
    stolen = app.test_client()
    stolen.set_cookie("loopstop_session", cookie.value)
    assert stolen.get("/ui").status_code == 200
    page = client.get("/ui").get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf and client.post("/ui/logout", data={"csrf": csrf.group(1)}).status_code == 303
    r = stolen.get("/ui")
    assert r.status_code == 401 and 'name="token"' in r.get_data(as_text=True)
    # Another app over the same store (another worker) refuses it too.
    other = make_app().test_client()
    other.set_cookie("loopstop_session", cookie.value)
    assert other.get("/ui").status_code == 401


def test_login_needs_its_csrf_token_and_wrong_tokens_are_slowed(
    make_app: AppFactory, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_app().test_client()
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN})
    assert r.status_code == 403  # no CSRF token from the login form: refused
    csrf = login_csrf(client)
    with caplog.at_level(logging.WARNING, logger="loopstop"):
        for _ in range(5):
            r = client.post("/ui/login", data={"token": "guess-000000000000", "csrf": csrf})
            assert r.status_code == 401
    refused = [m for m in caplog.messages if "matches no configured token" in m]
    assert len(refused) == 5 and all("127.0.0.1" in m and "/ui/login" in m for m in refused)
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN, "csrf": csrf})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1  # even the right one
    clock.advance(3)
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN, "csrf": csrf})
    assert r.status_code == 303


def test_session_cookie_is_secure_over_tls(make_app: AppFactory) -> None:
    app = make_app()
    tls = app.test_client()
    csrf = login_csrf_at(tls, "https://localhost")
    r = tls.post(
        "/ui/login", data={"token": ADMIN_TOKEN, "csrf": csrf}, base_url="https://localhost"
    )
    assert r.status_code == 303 and "Secure" in r.headers["Set-Cookie"]
    plain = app.test_client()
    plain.post("/ui/login", data={"token": ADMIN_TOKEN, "csrf": login_csrf(plain)})
    r = plain.get("/ui/login")
    assert "Secure" not in r.headers.get("Set-Cookie", "")


def login_csrf_at(client: FlaskClient, base_url: str) -> str:
    page = client.get("/ui/login", base_url=base_url).get_data(as_text=True)
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match
    return match.group(1)


# -- 14. exact names and numbers ------------------------------------------------


@pytest.mark.parametrize("workflow", ["wf\n", "wf\r\n", "wf\x00", ""])
def test_a_name_with_a_final_newline_is_422(api: Api, workflow: str) -> None:
    _, body = api.post(f"{OP}/o/begin", {"payload": 1, "workflow": workflow})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "workflow"]


def test_an_operation_id_with_a_final_newline_is_422(api: Api) -> None:
    task = api.post("/v1/tasks", {"workflow": "wf"})[1]["task"]["task_id"]
    _, body = api.post(
        f"/v1/tasks/{task}/tool-calls",
        {"tool": "send", "kind": "write", "args": {}, "operation_id": "mail:1\n"},
    )
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "operation_id"]
    assert api.client.post(f"{OP}/A%0A/begin", json={"payload": 1}, headers=AUTH).status_code == 422


def test_workflow_names_are_nfc_normalised(store_url: str, clock: Clock) -> None:
    tokens = [{"name": "cafe", "env": "LOOPSTOP_TOKEN_CAFE", "workflows": ["Cafe\u0301"]}]
    env = {"LOOPSTOP_SECRET": SECRET, "LOOPSTOP_TOKEN_CAFE": "tok-cafe-0123456789"}
    app = create_app({"store": store_url, "tokens": tokens}, environ=env, clock=clock)
    api = Api(app.test_client(), token="tok-cafe-0123456789")
    first = api.begin("o", 1, workflow="Caf\u00e9")
    assert first["decision"] == "execute" and first["operation"]["workflow"] == "Caf\u00e9"
    again = api.begin("o", 1, workflow="Cafe\u0301")
    assert again["decision"] == "in_progress"


@pytest.mark.parametrize("attempt", ["1", True, 1.5, 1.0, None])
def test_attempt_is_a_strict_integer(api: Api, attempt: Any) -> None:
    begin(api, "o")
    _, body = api.post(f"{OP}/o/commit", {"attempt": attempt, "receipt": "r"})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "attempt"]
    assert api.get(f"{OP}/o")[1]["operation"]["state"] == "in_progress"


def test_duplicate_keys_are_400(api: Api) -> None:
    begin(api, "o")
    raw = b'{"attempt": 1, "receipt": "a", "receipt": "b"}'
    r = api.client.post(f"{OP}/o/commit", data=raw, content_type="application/json", headers=AUTH)
    problem(400, r.get_json(), "malformed-request")
    assert "receipt" in r.get_json()["detail"]
    nested = b'{"payload": {"to": "a", "to": "b"}}'
    r = api.client.post(f"{OP}/p/begin", data=nested, content_type="application/json", headers=AUTH)
    assert r.status_code == 400
    assert api.get(f"{OP}/o")[1]["operation"]["state"] == "in_progress"


# -- 15. authentication failures are logged and counted --------------------------


def _failures(app: Flask, reason: str) -> float:
    registry = app.extensions["loopstop"].metrics.registry
    return registry.get_sample_value("loopstop_auth_failures_total", {"reason": reason}) or 0.0


def test_auth_failures_are_logged_and_counted(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    client = app.test_client()
    before = _failures(app, "unauthenticated"), _failures(app, "foreign-origin")
    with caplog.at_level(logging.WARNING, logger="loopstop"):
        r = client.get("/v1/whoami", headers={"Authorization": "Bearer wrong-token-00000000"})
        assert r.status_code == 401
        r = client.get("/v1/whoami", headers={**AUTH, "Origin": EVIL})
        assert r.status_code == 403
    assert _failures(app, "unauthenticated") == before[0] + 1
    assert _failures(app, "foreign-origin") == before[1] + 1
    lines = [m for m in caplog.messages if "authentication refused" in m]
    assert any("/v1/whoami" in m and "127.0.0.1" in m for m in lines)
    assert not any("wrong-token" in m for m in caplog.messages)  # never the value


def test_metrics_token_is_compared_over_digests(make_app: AppFactory) -> None:
    app = make_app(
        http={"metrics_token_env": "METRICS_TOKEN"},
        environ={"METRICS_TOKEN": "metrics-0123456789"},
    )
    client = app.test_client()
    for given in ("", "metrics-0123456788", "metrics-0123456789x", "m"):
        r = client.get("/metrics", headers={"Authorization": f"Bearer {given}"})
        assert r.status_code == 401
    r = client.get("/metrics", headers={"Authorization": "Bearer metrics-0123456789"})
    assert r.status_code == 200 and b"loopstop_auth_failures_total" in r.data


# -- 16. the page's reconcile with a bad outcome --------------------------------


def test_ui_reconcile_with_a_bad_outcome_is_a_400_page(make_app: AppFactory) -> None:
    app = make_app()
    api = Api(app.test_client())
    begin(api, "pay:1", workflow="wf-pay")
    api.post(f"{OP}/pay:1/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf-pay"})
    client = app.test_client()
    csrf = login(client, ADMIN_TOKEN)
    for outcome in ("maybe", ""):
        r = client.post(
            "/ui/operations/pay:1/reconcile",
            data={"outcome": outcome, "evidence": "e", "csrf": csrf, "workflow": "wf-pay"},
        )
        assert r.status_code == 400 and r.mimetype == "text/html"
        assert "outcome must be committed or not_committed" in r.get_data(as_text=True)
    assert api.get(f"{OP}/pay:1", workflow="wf-pay")[1]["operation"]["state"] == "unknown"


@pytest.mark.parametrize("field", [{"task_key": "ticket-9\n"}, {"chain_id": "c" + "0" * 20 + "\n"}])
def test_task_key_and_chain_id_with_a_final_newline_are_422(
    api: Api, field: dict[str, str]
) -> None:
    _, body = api.post("/v1/tasks", {"workflow": "wf", **field})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", next(iter(field))]


def test_a_tasks_checks_are_scoped_too(make_app: AppFactory, sor: SystemOfRecord) -> None:
    """A scoped token's task may not run an exit or tool check closed to its workflow."""
    app = make_app(
        checks=checks(sor.base),
        tools={"get_order": {"kind": "read", "check": "order_of_orders"}},
        policies={"orders": {"exit_check": "order_of_orders"}},
    )
    scoped = Api(app.test_client(), SCOPED_TOKEN)
    status, body = scoped.post("/v1/tasks", {"workflow": "wf-sheets", "policy": "orders"})
    assert status == 201, body
    base = f"/v1/tasks/{body['task']['task_id']}"
    before = len(sor.seen_auth)
    _, body = scoped.post(base + "/complete", {"input": {"order_id": "ORD-1"}})
    problem(403, body, "forbidden")
    call = scoped.post(base + "/tool-calls", {"tool": "get_order", "kind": "read", "args": {}})[1]
    _, body = scoped.post(
        f"{base}/tool-calls/{call['call_id']}/result",
        {"status": "ok", "result": {"order_id": "ORD-1"}},
    )
    problem(403, body, "forbidden")
    assert len(sor.seen_auth) == before
