"""Checks are scoped and bounded (first hardening, item 10; DESIGN §4): a scoped token
cannot tell an absent check from a closed one, lists and runs only its own, and outside
calls are bounded."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from system_of_record import SystemOfRecord, scoped_checks, serve

from conftest import N8N_TOKEN, SCOPED_TOKEN, Api, AppFactory

AUTH = {"Authorization": f"Bearer {N8N_TOKEN}"}


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


# -- 10. checks are scoped and bounded ------------------------------------------


def test_a_scoped_token_cannot_tell_an_absent_check_from_a_closed_one(
    make_app: AppFactory, sor: SystemOfRecord
) -> None:
    """Running a check, or naming it as a begin's reconcile check, answers a
    scoped token the same for a check outside its workflows and for no check at
    all: nothing says it exists or what it asks."""
    api = Api(make_app(checks=scoped_checks(sor.base)).test_client())
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
    api = Api(make_app(checks=scoped_checks(sor.base)).test_client())
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
    api = Api(make_app(checks=scoped_checks(sor.base)).test_client())
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
    app = make_app(
        checks=scoped_checks(sor.base), http={"checks_concurrency": 1, "checks_wait_s": 0.2}
    )
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


def test_a_tasks_checks_are_scoped_too(make_app: AppFactory, sor: SystemOfRecord) -> None:
    """A scoped token's task may not run an exit or tool check closed to its workflow."""
    app = make_app(
        checks=scoped_checks(sor.base),
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
