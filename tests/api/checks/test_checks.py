"""Checks against a real local system of record, on every store: exits are
validated, a check never passes by default, placeholders stay in the path."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from system_of_record import SystemOfRecord, serve
from task_agent import Agent

from conftest import ADMIN_TOKEN, SCOPED_TOKEN, Api, AppFactory

SECRET_HEADER = "Bearer orders-secret-0123456789"


@pytest.fixture(scope="module")
def sor() -> Iterator[SystemOfRecord]:
    with serve() as data:
        yield data


def checks_config(base: str) -> dict[str, Any]:
    return {
        "order_confirmed": {
            "kind": "http",
            "url": base + "/orders/{order_id}",
            "expect_status": [200],
            "assert": ["status == 'confirmed'"],
            "revision": "version",
            "timeout_s": 2,
            "headers": {"Authorization": {"env": "ORDERS_TOKEN", "prefix": "Bearer "}},
        },
        "order_confirmed_gzip": {
            "kind": "http",
            "url": base + "/gzip/{order_id}",
            "assert": ["status == 'confirmed'"],
            "revision": "version",
        },
        "comment_exists": {"kind": "http", "url": base + "/comments/{comment_id}"},
        "slow": {"kind": "http", "url": base + "/slow/{x}", "timeout_s": 0.5},
        "broken": {"kind": "http", "url": base + "/broken", "assert": ["ok"]},
        "redirect": {"kind": "http", "url": base + "/redirect"},
        "trickle": {"kind": "http", "url": base + "/trickle", "timeout_s": 0.6},
        "huge": {"kind": "http", "url": base + "/huge", "assert": ["status == 'confirmed'"]},
        "deep": {"kind": "http", "url": base + "/deep", "assert": ["length(@) > `0`"]},
        "bigrev": {"kind": "http", "url": base + "/bigrev", "revision": "version"},
        "echo": {"kind": "http", "url": base + "/echo/{v}?q={v}"},
        "charge_found": {
            "kind": "http",
            "url": base + "/charges/{ref}",
            "assert": ["status == 'succeeded'"],
        },
        "down": {"kind": "http", "url": "http://127.0.0.1:9/orders/{order_id}", "timeout_s": 1},
        "answer_shape": {
            "kind": "json_schema",
            "path": "output",
            "schema": {"type": "object", "required": ["answer"]},
        },
        "all_pages": {"kind": "cursor", "cursor": "next_cursor", "records": "items[].id"},
        "receipts": {"kind": "operations", "operations": "operation_ids"},
        "order_done": {"kind": "all", "of": ["order_confirmed", "receipts"]},
    }


@pytest.fixture
def app(make_app: AppFactory, sor: SystemOfRecord) -> Flask:
    return make_app(
        checks=checks_config(sor.base),
        tools={
            "get_order": {"kind": "read", "check": "order_confirmed"},
            "get_order_down": {"kind": "read", "check": "down"},
            "update_order": {"kind": "write", "check": "order_confirmed"},
            "update_order_down": {"kind": "write", "check": "down"},
            "list_orders": {"kind": "read", "check": "all_pages"},
            "list_customers": {"kind": "read", "check": "all_pages"},
            "get_comment": {"kind": "read", "check": "comment_exists"},
        },
        policies={"orders": {"exit_check": "order_confirmed"}},
        environ={"ORDERS_TOKEN": "orders-secret-0123456789"},
    )


@pytest.fixture
def api(app: Flask) -> Api:
    return Api(app.test_client())


def check(api: Api, name: str, data: Any, task_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"input": data}
    if task_id:
        body["task_id"] = task_id
    status, out = api.post(f"/v1/checks/{name}", body)
    assert status == 200, out
    return dict(out)


def test_order_confirmed_completes_the_task(api: Api, sor: SystemOfRecord) -> None:
    a = Agent(api, policy="orders")
    out = a.post("/complete", {"input": {"order_id": "ORD-1"}})
    assert out["decision"] == "completed" and out["check"]["revision"] == 3
    assert out["envelope"]["validated_revision"] == 3
    assert sor.seen_auth[-1] == SECRET_HEADER
    assert "orders-secret" not in str(out)


def test_a_completion_check_asks_outside_once_and_only_for_the_callers_task(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    """Without exit-check policies too, the task is read before a check asks
    the system of record: a test task completed by a production request (an
    agent's sub-workflow) is asked about once; another workflow's task, a
    scoped token and a missing task are refused before anything is asked."""
    api = Api(make_app(checks=checks_config(sor.base)).test_client())
    comment = {"check": "comment_exists", "input": {"comment_id": "c-1"}}

    a = Agent(api, execution_mode="test")
    asked = len(sor.seen_auth)
    assert a.post("/complete", comment)["decision"] == "completed"
    assert len(sor.seen_auth) == asked + 1

    other = Agent(api, workflow="wf-other")
    asked = len(sor.seen_auth)
    status, _ = api.post(other.base + "/complete", comment, token=SCOPED_TOKEN)
    assert status == 403
    assert api.post("/v1/tasks/t00000000000000000000/complete", comment)[0] == 404
    assert len(sor.seen_auth) == asked


def test_claimed_comment_that_is_404_is_not_completion(api: Api) -> None:
    a = Agent(api)
    out = a.post("/complete", {"check": "comment_exists", "input": {"comment_id": "c-404"}})
    assert out["decision"] == "continue" and out["reason"] == "check_failed"
    assert out["check"]["reason"] == "unexpected_status"
    assert out["check"]["evidence"]["status"] == 404
    assert (
        a.post("/complete", {"check": "comment_exists", "input": {"comment_id": "c-1"}})["decision"]
        == "completed"
    )


def test_pending_is_not_terminal_success(api: Api) -> None:
    out = check(api, "order_confirmed", {"order_id": "ORD-2"})
    assert (out["passed"], out["reason"], out["revision"]) == (False, "assertion_failed", 1)
    assert out["evidence"]["assertions"] == [{"assert": "status == 'confirmed'", "ok": False}]


def test_a_compressed_answer_is_read_decompressed(api: Api) -> None:
    """A system of record behind a web server that gzips JSON answers is read
    as its JSON (the session asks for gzip), not refused as a body that is not JSON."""
    out = check(api, "order_confirmed_gzip", {"order_id": "ORD-1"})
    assert (out["passed"], out["reason"], out["revision"]) == (True, "passed", 3)
    out = check(api, "order_confirmed_gzip", {"order_id": "ORD-2"})
    assert out["reason"] == "assertion_failed"


def test_cannot_answer_never_passes(api: Api) -> None:
    started = time.monotonic()
    assert check(api, "slow", {"x": 1})["reason"] == "timeout"
    assert time.monotonic() - started < 1.5  # within the configured bound (0.5 s)
    assert check(api, "broken", {})["reason"] == "bad_response"
    assert check(api, "down", {"order_id": "x"})["reason"] == "unreachable"
    assert check(api, "order_confirmed", {})["reason"] == "missing_input"
    out = check(api, "redirect", {})
    assert out["reason"] == "unexpected_status" and out["evidence"]["status"] == 302


@pytest.mark.parametrize(
    "value", ["../../admin", "x@evil.example", "a/b?c#d", "%2e%2e", "a\\..\\b", "..x"]
)
def test_placeholders_stay_inside_the_path_and_query(
    api: Api, sor: SystemOfRecord, value: str
) -> None:
    out = check(api, "echo", {"v": value})
    assert out["passed"] is True
    url = out["evidence"]["url"]
    assert url.startswith(sor.base + "/echo/")
    path = url.removeprefix(sor.base)
    assert path.count("/") == 2 and "@" not in path.split("?")[0] and "#" not in url


@pytest.mark.parametrize("value", ["", ".", "..", "..."])
def test_empty_or_dot_values_are_refused(api: Api, value: str) -> None:
    out = check(api, "echo", {"v": value})
    assert out["passed"] is False and out["reason"] == "missing_input"


def test_cursor_lineage_cycle_and_constant_cursor(api: Api) -> None:
    a = Agent(api)
    pages = [
        {"next_cursor": "A", "items": [{"id": 1}, {"id": 2}]},
        {"next_cursor": "B", "items": [{"id": 3}]},
        {"next_cursor": "A", "items": [{"id": 1}]},
    ]
    results = [check(api, "all_pages", p, a.id) for p in pages]
    assert [r["reason"] for r in results] == ["passed", "passed", "cycle"]
    assert [r["revision"] for r in results] == [2, 3, 3]
    b = Agent(api)
    constant = [
        check(api, "all_pages", {"next_cursor": "h", "items": [{"id": i}]}, b.id) for i in range(4)
    ]
    assert all(r["passed"] for r in constant) and constant[-1]["revision"] == 4
    stuck = check(api, "all_pages", {"next_cursor": "z", "items": [{"id": 0}]}, b.id)
    assert stuck["reason"] == "no_new_records"
    status, out = api.post("/v1/checks/all_pages", {"input": pages[0]})
    assert status == 200 and out["reason"] == "missing_input"


def test_tool_check_drives_progress_and_cycles(api: Api) -> None:
    a = Agent(api, token=ADMIN_TOKEN, limits={"max_same_call": 10})
    for page in (
        {"next_cursor": "opaque", "items": [{"id": 1}]},
        {"next_cursor": "opaque", "items": [{"id": 2}]},
    ):
        out = a.result(
            a.call("list_orders", {"cursor": "opaque"}), result=page, evidence={"revision": 999}
        )  # the caller's evidence is ignored
        assert out["check"]["passed"] is True
    assert api.get(a.base)[1]["task"]["validated_revision"] == 2
    a.result(
        a.call("list_orders", {"cursor": "B"}), result={"next_cursor": "B", "items": [{"id": 3}]}
    )
    out = a.result(
        a.call("list_orders", {"cursor": "opaque"}),
        result={"next_cursor": "opaque", "items": [{"id": 1}]},
    )
    assert out["envelope"]["reason"] == "cycle"


def test_tool_check_that_cannot_run(api: Api) -> None:
    read = Agent(api)
    out = read.result(
        read.call("get_order_down", {"order_id": "ORD-1"}), result={"order_id": "ORD-1"}
    )
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == (
        "blocked",
        "unverified_result",
    )
    write = Agent(api)
    call = write.call(
        "update_order_down", {"order_id": "ORD-1"}, kind="write", operation_id="upd:ORD-1"
    )
    out = write.result(call, result={"order_id": "ORD-1"}, receipt="r")
    assert out["envelope"]["reason"] == "unknown_commit"
    assert (
        api.get("/v1/operations/upd:ORD-1", workflow="wf-sheets")[1]["operation"]["state"]
        == "unknown"
    )


def test_write_confirmed_by_its_check(api: Api) -> None:
    a = Agent(api)
    call = a.call("update_order", {"order_id": "ORD-1"}, kind="write", operation_id="upd:1")
    out = a.result(call, result={"order_id": "ORD-1"}, receipt={"version": 3})
    assert out["decision"] == "recorded" and out["task"]["validated_revision"] == 3
    assert (
        api.get("/v1/operations/upd:1", workflow="wf-sheets")[1]["operation"]["state"]
        == "committed"
    )


def test_reconcile_by_check_finds_the_committed_charge(api: Api, sor: SystemOfRecord) -> None:
    spec = {"check": "charge_found", "input": {"ref": "ch-9"}}
    first = api.begin("charge:order-9", {"amount": 129.5}, reconcile=spec)
    assert first["decision"] == "execute"
    api.post("/v1/operations/charge:order-9/fail", {"attempt": 1, "outcome": "unknown"})
    sor.charges["ch-9"] = {"ref": "ch-9", "status": "succeeded", "amount": 129.5}
    out = api.begin("charge:order-9", {"amount": 129.5})
    assert (out["decision"], out["reason"]) == ("replay", "reconciled_committed")
    assert out["operation"]["reconciliation"]["actor"] == "check:charge_found"
    assert api.begin("charge:order-9", {"amount": 129.5})["decision"] == "replay"


def test_reconcile_by_check_proven_absent_and_undecided(api: Api) -> None:
    spec = {"check": "charge_found", "input": {"ref": "ch-never"}}
    api.begin("charge:order-10", {"amount": 5}, reconcile=spec)
    api.post("/v1/operations/charge:order-10/fail", {"attempt": 1, "outcome": "unknown"})
    out = api.begin("charge:order-10", {"amount": 5})
    assert (out["decision"], out["reason"]) == ("execute", "reconciled_not_committed")
    assert out["operation"]["attempt"] == 2
    down = {"check": "down", "input": {"order_id": "x"}}
    api.begin("charge:order-11", {"amount": 5}, reconcile=down)
    api.post("/v1/operations/charge:order-11/fail", {"attempt": 1, "outcome": "unknown"})
    out = api.begin("charge:order-11", {"amount": 5})
    assert (out["decision"], out["reason"]) == ("reconcile", "outcome_unknown")
    status, body = api.post(
        "/v1/operations/x/begin", {"payload": 1, "reconcile": {"check": "nope"}}
    )
    assert status == 422 and body["errors"][0]["loc"] == ["body", "reconcile", "check"]


def test_operations_and_combined_checks(api: Api) -> None:
    api.begin("op-a", {"x": 1})
    api.post("/v1/operations/op-a/commit", {"attempt": 1, "receipt": "r"})
    api.begin("op-b", {"x": 1})
    assert check(api, "receipts", {"operation_ids": ["op-a"]})["passed"] is True
    out = check(api, "receipts", {"operation_ids": ["op-a", "op-b", "op-c"]})
    assert out["reason"] == "not_committed"
    assert out["evidence"]["operations"] == {
        "op-a": "committed",
        "op-b": "in_progress",
        "op-c": "missing",
    }
    both = check(api, "order_done", {"order_id": "ORD-1", "operation_ids": ["op-a"]})
    assert both["passed"] is True and both["revision"] == 3
    assert (
        check(api, "order_done", {"order_id": "ORD-2", "operation_ids": ["op-a"]})["reason"]
        == "assertion_failed"
    )


def test_json_schema_and_listing(api: Api) -> None:
    assert check(api, "answer_shape", {"output": {"answer": "42"}})["passed"] is True
    out = check(api, "answer_shape", {"output": {"text": "42"}})
    assert out["reason"] == "schema_invalid" and "answer" in out["evidence"]["first"]
    status, body = api.get("/v1/checks")
    assert status == 200 and {"name": "all_pages", "kind": "cursor"} in body["checks"]
    assert api.post("/v1/checks/nope", {"input": {}})[0] == 404


def test_http_check_url_may_not_template_the_host(make_app: AppFactory) -> None:
    from sidecar.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        make_app(checks={"x": {"kind": "http", "url": "http://{host}/orders/{id}"}})
    assert info.value.problems[0][0].startswith("checks.x")


def test_admin_sees_checks(api: Api) -> None:
    assert api.get("/v1/checks", token=ADMIN_TOKEN)[0] == 200


def test_a_trickling_answer_is_bounded_by_the_whole_timeout(api: Api) -> None:
    started = time.monotonic()
    out = check(api, "trickle", {})
    assert out["reason"] == "timeout" and time.monotonic() - started < 1.5


@pytest.mark.parametrize("name", ["huge", "deep", "bigrev"])
def test_oversized_or_absurd_answers_are_bad_responses(api: Api, name: str) -> None:
    assert check(api, name, {})["reason"] == "bad_response"


def test_operations_check_on_an_empty_list_fails(api: Api) -> None:
    assert check(api, "receipts", {"operation_ids": []})["reason"] == "missing_input"


def test_the_policys_exit_check_cannot_be_swapped(api: Api) -> None:
    a = Agent(api, policy="orders")
    status, out = api.post(
        f"{a.base}/complete", {"check": "answer_shape", "input": {"output": {"answer": "x"}}}
    )
    assert status == 422 and out["errors"][0]["loc"] == ["body", "check"]
    out = a.post("/complete", {"evidence": {"done": True}})  # no input: the check fails
    assert out["decision"] == "continue" and out["check"]["reason"] == "missing_input"


def test_tools_sharing_a_cursor_check_page_separately(api: Api) -> None:
    a = Agent(api)
    page = {"next_cursor": "p2", "items": [{"id": 1}, {"id": 2}]}
    a.result(a.call("list_orders", {"p": 1}), result=page)
    out = a.result(a.call("list_customers", {"p": 1}), result=page)
    assert out["decision"] == "recorded" and out["check"]["passed"] is True


def test_a_passing_check_without_revision_is_not_idle(api: Api) -> None:
    a = Agent(api, token=ADMIN_TOKEN, limits={"max_idle": 2})
    first = a.call("get_order", {"order_id": "ORD-1"})
    assert first["decision"] == "execute", first
    a.result(first, result={"order_id": "ORD-1"})
    for n in range(3):
        call = a.call("get_comment", {"comment_id": "c-1", "n": n})
        out = a.result(call, result={"comment_id": "c-1", "n": n})
        assert out["decision"] == "recorded", out
