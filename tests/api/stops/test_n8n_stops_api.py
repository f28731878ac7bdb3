"""Stops reach n8n (DESIGN §6), through the app on every store, against a real local
HTTP server that answers like n8n's public API (tests/fake_n8n.py).

Every answer lists each execution with what n8n reported before and after;
an execution is confirmed only when n8n reported it finished, and the
loopstop stop holds whatever n8n does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
from fake_n8n import FakeExecution, FakeN8n, FakeN8nServer
from flask import Flask

from conftest import ADMIN_TOKEN, SCOPED_TOKEN, SECRET, Api, AppFactory, Clock, free_port, sql_rows
from sidecar.app import create_app
from sidecar.urls import redact_url

KEY = "n8n-api-key-0123456789"
T = TypeVar("T")


@pytest.fixture
def n8n() -> Iterator[FakeN8nServer]:
    server = FakeN8nServer(FakeN8n(key=KEY)).start()
    yield server
    server.stop()


def build(
    make_app: AppFactory, api_url: str, key: str = KEY, confirm_s: float = 5, **sections: Any
) -> Flask:
    return make_app(
        environ={"N8N_API_KEY": key},
        n8n={"api_url": api_url, "timeout_s": 2, "confirm_s": confirm_s},
        **sections,
    )


def admin(app: Flask) -> Api:
    return Api(app.test_client(), ADMIN_TOKEN)


def by_id(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["execution_id"]: e for e in answer["cancellation"]["executions"]}


def activation(api: Api, workflow: str, key: str, execution_id: str, **kw: Any) -> dict[str, Any]:
    status, out = api.post(
        "/v1/activations",
        {"workflow": workflow, "event_key": key, "execution_id": execution_id, **kw},
    )
    assert status == 200, out
    return dict(out)


def test_workflow_stop_cancels_running_and_waiting_executions_of_its_mode(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(
        FakeExecution("1", "wf-a", status="waiting"),
        FakeExecution("2", "wf-a", status="waiting"),
        FakeExecution("3", "wf-a", mode="trigger", status="running"),
        FakeExecution("4", "wf-a", mode="manual", status="waiting"),  # an editor test run
        FakeExecution("5", "wf-b", status="waiting"),  # another workflow
        FakeExecution("6", "wf-a", status="success"),  # already over: not listed
    )
    api = admin(build(make_app, n8n.api_url))
    status, out = api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})
    assert status == 200, out
    assert out["stopped"]["reason"] == "runaway"
    assert out["cancellation"]["state"] == "confirmed"
    assert out["cancellation"]["error"] is None
    got = by_id(out)
    assert set(got) == {"1", "2", "3"}  # paginated listing (2 per page) read to the end
    assert got["1"] == {
        "execution_id": "1",
        "status_before": "waiting",
        "status_after": "canceled",
        "confirmed": True,
        "result": "stopped",
        "error": None,
    }
    assert got["3"]["status_before"] == "running"
    assert sorted(n8n.state.stops()) == ["1", "2", "3"]
    assert n8n.state.executions["4"].status == "waiting"  # test mode is not production's
    assert n8n.state.executions["5"].status == "waiting"
    # The GET of the workflow shows what was confirmed; the loopstop stop holds.
    status, seen = api.get("/v1/workflows/wf-a")
    assert status == 200 and seen["cancellation"] == out["cancellation"]
    assert activation(api, "wf-a", "row:1", "7")["reason"] == "stopped"


def test_a_test_mode_workflow_stop_cancels_only_editor_runs(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(
        FakeExecution("1", "wf-a", mode="webhook", status="waiting"),
        FakeExecution("2", "wf-a", mode="manual", status="waiting"),
    )
    api = admin(build(make_app, n8n.api_url))
    status, out = api.post(
        "/v1/workflows/wf-a/stop", {"reason": "editor loop", "execution_mode": "test"}
    )
    assert status == 200, out
    assert set(by_id(out)) == {"2"}
    assert out["cancellation"]["execution_mode"] == "test"
    assert n8n.state.executions["1"].status == "waiting"
    # Each mode keeps its own record of what it asked n8n.
    assert api.get("/v1/workflows/wf-a")[1]["cancellation"] is None
    assert (
        api.get("/v1/workflows/wf-a", execution_mode="test")[1]["cancellation"]
        == (out["cancellation"])
    )


def test_chain_stop_cancels_only_the_executions_that_acted_for_it(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(
        FakeExecution("11", "wf-a"),
        FakeExecution("12", "wf-a"),
        FakeExecution("21", "wf-a"),
    )
    api = admin(build(make_app, n8n.api_url))
    first = activation(api, "wf-a", "row:1", "11")
    other = activation(api, "wf-a", "row:2", "21")
    # A second execution acts for the first chain through an effect.
    status, eff = api.post(
        "/v1/effects",
        {
            "chain_id": first["chain_id"],
            "target_key": "row:9",
            "content": {"a": 1},
            "execution_id": "12",
        },
    )
    assert status == 200, eff
    status, chain = api.get(f"/v1/chains/{first['chain_id']}")
    assert [e["execution_id"] for e in chain["chain"]["executions"]] == ["11", "12"]
    assert chain["chain"]["executions"][0]["execution_mode"] == "production"

    status, out = api.post(f"/v1/chains/{first['chain_id']}/stop", {"reason": "loop"})
    assert status == 200, out
    assert out["cancellation"]["state"] == "confirmed"
    assert set(by_id(out)) == {"11", "12"}
    assert all(e["confirmed"] and e["result"] == "stopped" for e in by_id(out).values())
    assert n8n.state.executions["21"].status == "waiting"  # the other chain keeps waiting
    assert "21" not in n8n.state.stops()
    assert api.get(f"/v1/chains/{first['chain_id']}")[1]["cancellation"] == out["cancellation"]
    assert api.get(f"/v1/chains/{other['chain_id']}")[1]["cancellation"] is None


def test_chain_executions_are_bounded_to_the_last_fifty(make_app: AppFactory) -> None:
    api = admin(make_app())
    first = activation(api, "wf-a", "row:1", "1")
    for i in range(2, 60):
        status, _ = api.post(
            "/v1/effects",
            {
                "chain_id": first["chain_id"],
                "target_key": f"row:{i}",
                "content": {"a": i},
                "execution_id": str(i),
            },
        )
        assert status == 200
    listed = api.get(f"/v1/chains/{first['chain_id']}")[1]["chain"]["executions"]
    assert [e["execution_id"] for e in listed] == [str(i) for i in range(10, 60)]


def test_task_stop_cancels_the_executions_of_the_task(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(FakeExecution("31", "wf-a", status="running"), FakeExecution("32", "wf-a"))
    api = admin(build(make_app, n8n.api_url))
    status, task = api.post("/v1/tasks", {"workflow": "wf-a", "execution_id": "31"})
    assert status == 201, task
    tid = task["task"]["task_id"]
    status, _ = api.post(f"/v1/tasks/{tid}/model-calls", {"execution_id": "32"})
    listed = api.get(f"/v1/tasks/{tid}")[1]["executions"]
    assert [(e["execution_id"], e["execution_mode"]) for e in listed] == [
        ("31", "production"),
        ("32", "production"),
    ]
    status, out = api.post(f"/v1/tasks/{tid}/stop", {"reason": "operator"})
    assert status == 200, out
    assert out["envelope"]["reason"] == "operator_stop"
    assert out["cancellation"]["state"] == "confirmed"
    assert {k: v["status_before"] for k, v in by_id(out).items()} == {
        "31": "running",
        "32": "waiting",
    }
    assert api.get(f"/v1/tasks/{tid}")[1]["cancellation"] == out["cancellation"]


def test_unreachable_n8n_fails_the_cancellation_and_the_stop_holds(make_app: AppFactory) -> None:
    api = admin(build(make_app, f"http://127.0.0.1:{free_port()}/api/v1"))
    status, out = api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})
    assert status == 200, out
    assert out["stopped"] is not None
    assert out["cancellation"]["state"] == "failed"
    assert out["cancellation"]["error"].startswith("unreachable")
    assert activation(api, "wf-a", "row:1", "1")["reason"] == "stopped"
    # /readyz stays ready and warns.
    status, ready = api.get("/readyz")
    assert status == 200 and ready["status"] == "ready"
    assert ready["n8n"]["reachable"] is False and "unreachable" in ready["n8n"]["warning"]


def test_a_refused_key_fails_the_cancellation_and_the_stop_holds(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(FakeExecution("1", "wf-a"))
    api = admin(build(make_app, n8n.api_url, key="wrong-key-0123456789"))
    first = activation(api, "wf-a", "row:1", "1")
    status, out = api.post(f"/v1/chains/{first['chain_id']}/stop", {"reason": "loop"})
    assert status == 200, out
    assert out["chain"]["stopped"] is not None
    assert out["cancellation"]["state"] == "failed"
    assert out["cancellation"]["error"].startswith("key_refused")
    only = by_id(out)["1"]
    assert only["confirmed"] is False and only["result"] == "unconfirmed"
    assert n8n.state.executions["1"].status == "waiting"
    assert api.get("/readyz")[1]["n8n"]["reachable"] is False


def test_an_execution_that_finished_by_itself_is_reported_so(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(
        FakeExecution("1", "wf-a", status="running", on_stop="finish"),
        FakeExecution("2", "wf-a", status="waiting"),
    )
    api = admin(build(make_app, n8n.api_url))
    status, out = api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})
    assert status == 200, out
    got = by_id(out)
    assert got["1"]["status_before"] == "running"
    assert got["1"]["status_after"] == "success"
    assert got["1"]["result"] == "finished" and got["1"]["confirmed"] is True
    assert got["2"]["result"] == "stopped"
    assert out["cancellation"]["state"] == "confirmed"


def test_an_execution_n8n_does_not_end_is_unconfirmed_never_stopped(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(
        FakeExecution("1", "wf-a", status="running", on_stop="ignore"),
        FakeExecution("2", "wf-a", status="running", polls=2),  # canceled after two reads
    )
    api = admin(build(make_app, n8n.api_url, confirm_s=1))
    status, out = api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})
    assert status == 200, out
    got = by_id(out)
    assert got["1"] == {
        "execution_id": "1",
        "status_before": "running",
        "status_after": "running",
        "confirmed": False,
        "result": "unconfirmed",
        "error": None,
    }
    assert got["2"]["confirmed"] is True and got["2"]["status_after"] == "canceled"
    assert out["cancellation"]["state"] == "partial"
    assert 0.5 <= out["cancellation"]["elapsed_s"] < 3


def test_a_repeated_stop_is_idempotent_and_checks_again(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(FakeExecution("1", "wf-a"))
    api = admin(build(make_app, n8n.api_url))
    first = activation(api, "wf-a", "row:1", "1")
    path = f"/v1/chains/{first['chain_id']}/stop"
    one = api.post(path, {"reason": "loop"})[1]
    two = api.post(path, {"reason": "again"})[1]
    assert two["chain"]["stopped"] == one["chain"]["stopped"]  # the first stop stands
    assert by_id(one)["1"]["result"] == "stopped"
    assert by_id(two)["1"] == {
        "execution_id": "1",
        "status_before": "canceled",
        "status_after": "canceled",
        "confirmed": True,
        "result": "already_finished",
        "error": None,
    }
    assert n8n.state.stops() == ["1"]  # asked once; the second stop only looked
    # A workflow stop repeated lists again and finds nothing left.
    api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})
    again = api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})[1]
    assert again["cancellation"]["state"] == "nothing_to_stop"


def test_a_slow_n8n_bounds_how_long_a_stop_asks(make_app: AppFactory, n8n: FakeN8nServer) -> None:
    """Past confirm_s plus one request's timeout, the executions left are not asked
    and stay unconfirmed: the answer comes back in bounded time."""
    n8n.state.add(*(FakeExecution(str(i), "wf-a") for i in range(1, 6)))
    n8n.state.delay_s = 0.2
    app = make_app(
        environ={"N8N_API_KEY": KEY},
        n8n={"api_url": n8n.api_url, "timeout_s": 0.5, "confirm_s": 0.2},
    )
    api = admin(app)
    chain = activation(api, "wf-a", "row:1", "1")["chain_id"]
    for i in range(2, 6):
        api.post(
            "/v1/effects",
            {"chain_id": chain, "target_key": f"t{i}", "content": {}, "execution_id": str(i)},
        )
    out = api.post(f"/v1/chains/{chain}/stop", {"reason": "loop"})[1]
    got = by_id(out)
    assert got["1"]["result"] == "stopped"
    left = [e for e in got.values() if e["error"] == "not asked: n8n.confirm_s passed"]
    assert left and all(e["result"] == "unconfirmed" and not e["confirmed"] for e in left)
    assert out["cancellation"]["state"] == "partial"
    assert out["cancellation"]["elapsed_s"] < 3
    assert len(n8n.state.stops()) < 5


def test_an_execution_n8n_does_not_know_is_not_found(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    api = admin(build(make_app, n8n.api_url))
    first = activation(api, "wf-a", "row:1", "999")
    out = api.post(f"/v1/chains/{first['chain_id']}/stop", {"reason": "loop"})[1]
    assert by_id(out)["999"]["result"] == "not_found"
    assert by_id(out)["999"]["confirmed"] is False
    assert out["cancellation"]["state"] == "partial"


def test_without_an_n8n_section_the_stop_says_nothing_was_asked(make_app: AppFactory) -> None:
    api = admin(make_app())
    first = activation(api, "wf-a", "row:1", "1")
    out = api.post(f"/v1/chains/{first['chain_id']}/stop", {"reason": "loop"})[1]
    assert out["cancellation"]["state"] == "not_configured"
    assert by_id(out)["1"]["confirmed"] is False
    assert api.get("/readyz")[1]["n8n"] == {"configured": False}


def test_test_mode_chains_remember_test_executions(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(FakeExecution("1", "wf-a", mode="manual"), FakeExecution("2", "wf-a"))
    api = admin(build(make_app, n8n.api_url))
    test_chain = activation(api, "wf-a", "row:1", "1", execution_mode="test")
    activation(api, "wf-a", "row:1", "2")
    out = api.post(
        f"/v1/chains/{test_chain['chain_id']}/stop", {"reason": "loop", "execution_mode": "test"}
    )[1]
    assert set(by_id(out)) == {"1"}
    assert n8n.state.executions["2"].status == "waiting"


def test_readyz_reports_a_reachable_n8n(make_app: AppFactory, n8n: FakeN8nServer) -> None:
    api = admin(build(make_app, n8n.api_url))
    status, ready = api.get("/readyz")
    assert status == 200
    assert ready["n8n"] == {"configured": True, "reachable": True}


@pytest.mark.parametrize(
    ("execution_id", "ok"),
    [("123", True), ("a_b-9", True), ("", False), ("1/2", False), ("x" * 65, False)],
)
def test_execution_ids_are_validated(make_app: AppFactory, execution_id: str, ok: bool) -> None:
    api = admin(make_app())
    status, out = api.post(
        "/v1/activations", {"workflow": "wf-a", "event_key": "k", "execution_id": execution_id}
    )
    assert (status == 200) is ok, out
    if not ok:
        assert out["errors"][0]["loc"][-1] == "execution_id"


@pytest.mark.all_stores  # each store's expiry
def test_the_executions_of_a_task_are_kept_as_long_as_the_task(
    make_app: AppFactory, n8n: FakeN8nServer, store_url: str
) -> None:
    """The record of the executions that acted for a task expires with the task: when the
    task ends (its time to live shrinks to the retention) and when a resume extends it."""
    api = admin(build(make_app, n8n.api_url))
    status, task = api.post("/v1/tasks", {"workflow": "wf-a", "execution_id": "41"})
    assert status == 201, task
    tid = task["task"]["task_id"]

    def expiries() -> tuple[float, float]:
        """The expiry of the task and of its executions' record: the rows'
        ``expires_at`` (SQL stores), the seconds Redis still keeps each key."""
        keys = (f"p:task:{tid}", f"p:taskwatch:{tid}")
        if store_url.startswith("redis"):
            client = redis.Redis.from_url(store_url)
            left = [client.pttl(f"loopstop:{key}") / 1000 for key in keys]
            client.close()
            assert min(left) > 0, left  # both keys are there, with a time to live
            return left[0], left[1]
        rows = {key: expires for key, _, expires in sql_rows(store_url, "kv")}
        return rows[keys[0]], rows[keys[1]]

    assert expiries()[1] == pytest.approx(expiries()[0], abs=1)
    api.post(f"/v1/tasks/{tid}/stop", {"reason": "operator"})  # ended: kept for the retention
    task_expiry, watch_expiry = expiries()
    assert watch_expiry == pytest.approx(task_expiry, abs=1)
    status, out = api.post(
        f"/v1/tasks/{tid}/resume", {"reason": "more time", "extend": {"deadline_s": 86400 * 30}}
    )
    assert status == 200, out
    resumed_task, resumed_watch = expiries()
    assert resumed_task > task_expiry + 86400  # the resume made the task live longer
    assert resumed_watch == pytest.approx(resumed_task, abs=1)
    assert [e["execution_id"] for e in api.get(f"/v1/tasks/{tid}")[1]["executions"]] == ["41"]


@pytest.mark.security
def test_item9_the_n8n_urls_password_is_never_shown(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack item 9: with ``api_url: http://user:pw@...`` and n8n down, ``/readyz``, the
    stop's answer and the log printed the password (the store URL was redacted, n8n's not)."""
    secret = "s3cret-n8n-pw"
    api_url = f"http://loopstop:{secret}@127.0.0.1:{free_port()}/api/v1"
    api = admin(build(make_app, api_url))
    with caplog.at_level("DEBUG"):
        status, out = api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"})
        assert status == 200 and out["cancellation"]["state"] == "failed", out
        ready = api.get("/readyz")[1]
        seen = api.get("/v1/workflows/wf-a")[1]
    assert out["cancellation"]["error"].startswith("unreachable")
    assert "loopstop:***@127.0.0.1" in out["cancellation"]["error"]
    assert ready["n8n"]["reachable"] is False
    for shown in (str(out), str(ready), str(seen), caplog.text):
        assert secret not in shown


@pytest.mark.security
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:pw@h:1/api/v1", "http://u:***@h:1/api/v1"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("http://u:p/w@h/api", "http://u:***@h/api"),  # a raw "/" in the password
        ("http://u:p@w@h/api?x=1", "http://u:***@h/api?x=1"),  # a raw "@"
        ("http://u@h/api", "http://u@h/api"),  # no password: unchanged
        ("http://h/api?a=b@c", "http://h/api?a=b@c"),
        ("sqlite:///./loopstop.db", "sqlite:///./loopstop.db"),
    ],
)
def test_item9_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


SCOPED_ADMIN = "tok-scoped-admin-0123456789"


def scoped_app(store_url: str, clock: Clock, n8n: FakeN8nServer) -> Flask:
    """An app whose tokens are an ``n8n`` token and an admin, both limited to ``wf-a``."""
    config = {
        "store": store_url,
        "tokens": [
            {"name": "a-only", "env": "TOK_A", "workflows": ["wf-a"]},
            {"name": "a-admin", "env": "TOK_A_ADMIN", "workflows": ["wf-a"], "admin": True},
        ],
        "n8n": {"api_url": n8n.api_url, "timeout_s": 2, "confirm_s": 1},
    }
    env = {
        "LOOPSTOP_SECRET": SECRET,
        "TOK_A": SCOPED_TOKEN,
        "TOK_A_ADMIN": SCOPED_ADMIN,
        "N8N_API_KEY": KEY,
    }
    return create_app(config, environ=env, clock=clock)


@pytest.mark.security
def test_item1_a_task_stop_never_stops_another_workflows_execution(
    store_url: str, clock: Clock, n8n: FakeN8nServer
) -> None:
    """Attack item 1: a token scoped to workflow A named B's execution id on its own
    task (n8n's ids are sequential); the task stop asked n8n to stop it. Each id is now
    read from n8n first and stopped only when its workflowId and mode are the task's."""
    n8n.state.add(
        FakeExecution("6", "wf-a", status="running"),
        FakeExecution("7", "wf-b", status="running"),  # another workflow's
        FakeExecution("8", "wf-a", mode="manual", status="running"),  # an editor run
    )
    api = Api(scoped_app(store_url, clock, n8n).test_client(), SCOPED_TOKEN)
    status, task = api.post("/v1/tasks", {"workflow": "wf-a", "execution_id": "6"})
    assert status == 201, task
    tid = task["task"]["task_id"]
    for other in ("7", "8"):
        status, out = api.post(f"/v1/tasks/{tid}/model-calls", {"execution_id": other})
        assert status == 200, out
    status, out = api.post(f"/v1/tasks/{tid}/stop", {"reason": "mine"})
    assert status == 200, out
    got = by_id(out)
    assert got["6"]["result"] == "stopped" and got["6"]["confirmed"] is True
    for other in ("7", "8"):
        assert got[other]["result"] == "refused" and got[other]["confirmed"] is False
        assert got[other]["status_before"] is None and got[other]["status_after"] is None
        assert got[other]["error"].startswith("refused")
    assert "another workflow" in got["7"]["error"] and "another mode" in got["8"]["error"]
    assert n8n.state.stops() == ["6"]
    assert n8n.state.executions["7"].status == "running"
    assert n8n.state.executions["8"].status == "running"
    assert out["cancellation"]["state"] == "partial"  # not everything listed was confirmed


@pytest.mark.security
def test_item1_a_chain_stop_never_stops_another_workflows_execution(
    store_url: str, clock: Clock, n8n: FakeN8nServer
) -> None:
    """Attack item 1: an admin scoped to A stopped B's execution through an id carried on
    an A activation of the chain."""
    n8n.state.add(FakeExecution("11", "wf-a"), FakeExecution("12", "wf-b"))
    app = scoped_app(store_url, clock, n8n)
    api = Api(app.test_client(), SCOPED_TOKEN)
    chain = activation(api, "wf-a", "row:1", "11")["chain_id"]
    status, _ = api.post(
        "/v1/effects",
        {"chain_id": chain, "target_key": "t", "content": {"a": 1}, "execution_id": "12"},
    )
    assert status == 200
    listed = api.get(f"/v1/chains/{chain}")[1]["chain"]["executions"]
    assert [(e["execution_id"], e["workflow"]) for e in listed] == [("11", "wf-a"), ("12", "wf-a")]
    status, out = Api(app.test_client(), SCOPED_ADMIN).post(
        f"/v1/chains/{chain}/stop", {"reason": "loop"}
    )
    assert status == 200, out
    got = by_id(out)
    assert got["11"]["result"] == "stopped"
    assert got["12"]["result"] == "refused" and "another workflow" in got["12"]["error"]
    assert n8n.state.stops() == ["11"]
    assert n8n.state.executions["12"].status == "waiting"


@pytest.mark.security
def test_item1_a_chain_stop_stops_each_workflows_own_executions(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    """A chain that crosses workflows (A writes, B's trigger re-enters): each remembered
    execution is checked against the workflow it acted for, so a stop by a token holding
    both stops both; a record whose workflow is a name, not n8n's id, is refused."""
    n8n.state.add(FakeExecution("21", "wf-a"), FakeExecution("22", "wf-b"))
    api = admin(build(make_app, n8n.api_url))
    first = activation(api, "wf-a", "row:1", "21")
    status, eff = api.post(
        "/v1/effects",
        {"chain_id": first["chain_id"], "target_key": "row:2", "content": {"a": 1}},
    )
    assert status == 200, eff
    marker = eff.get("marker")
    again = activation(api, "wf-b", "row:2", "22", **({"marker": marker} if marker else {}))
    assert again["chain_id"] == first["chain_id"], again
    named = activation(api, "Order sync", "row:3", "21")  # a name: n8n knows no such id
    out = api.post(f"/v1/chains/{first['chain_id']}/stop", {"reason": "loop"})[1]
    assert {k: v["result"] for k, v in by_id(out).items()} == {"21": "stopped", "22": "stopped"}
    out = api.post(f"/v1/chains/{named['chain_id']}/stop", {"reason": "loop"})[1]
    assert by_id(out)["21"]["result"] == "refused"


@pytest.mark.security
@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/activations", {"workflow": "wf-a", "event_key": "k"}),
        ("/v1/tasks", {"workflow": "wf-a"}),
        ("/v1/effects", {"workflow": "wf-a", "target_key": "t", "content": {}}),
        ("/v1/operations/op-1/begin", {"workflow": "wf-a", "payload": {}}),
    ],
)
@pytest.mark.parametrize("execution_id", ["123\n", "12\n3", " 123", "1" * 65])
def test_item1_execution_ids_are_held_to_the_whole_pattern(
    make_app: AppFactory, route: str, body: dict[str, Any], execution_id: str
) -> None:
    """Attack item 1: ``execution_id`` is held to ``^[A-Za-z0-9_-]{1,64}$`` as a whole;
    Python's ``$`` let ``"123\\n"`` through."""
    api = admin(make_app())
    status, out = api.post(route, {**body, "execution_id": execution_id})
    assert status == 422, out
    assert out["errors"][0]["loc"] == ["body", "execution_id"]


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()``'s answer, failing the test when it takes longer than ``seconds``
    (the call goes on in a daemon thread: a hung request never hangs the suite)."""
    box: list[T] = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, f"no answer within {seconds} s"
    return box[0]


@pytest.mark.security
def test_item8_a_trickling_n8n_cannot_hold_a_stop_past_its_deadline(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    """Attack item 8: n8n trickling each body at 1 byte / 1.5 s (timeout_s 2) held a
    workflow stop 42 s with confirm_s 3: requests' timeout is per read and the listing
    was outside the deadline. A stop now asks n8n within confirm_s + timeout_s, listing
    included, and the loopstop stop holds."""
    n8n.state.add(FakeExecution("1", "wf-a"), FakeExecution("2", "wf-a"))
    n8n.state.trickle_s = 1.5
    app = make_app(
        environ={"N8N_API_KEY": KEY},
        n8n={"api_url": n8n.api_url, "timeout_s": 2, "confirm_s": 3},
    )
    api = admin(app)
    started = time.monotonic()
    status, out = within(10, lambda: api.post("/v1/workflows/wf-a/stop", {"reason": "runaway"}))
    took = time.monotonic() - started
    assert status == 200 and out["stopped"] is not None, out
    assert out["cancellation"]["state"] == "failed"
    assert out["cancellation"]["error"].startswith("timeout")
    assert took < 2 + 1.5 + 1, took  # one call's timeout_s (+ the read in flight)
    # A chain stop (reads, stops and polls) is bounded by confirm_s + timeout_s as a whole.
    chain = activation(api, "wf-b", "row:1", "1")["chain_id"]
    started = time.monotonic()
    out = within(15, lambda: api.post(f"/v1/chains/{chain}/stop", {"reason": "loop"}))[1]
    took = time.monotonic() - started
    assert took < 3 + 2 + 1.5 + 1, took
    assert by_id(out)["1"]["confirmed"] is False


@pytest.mark.security
def test_item8_readyz_never_waits_for_a_slow_n8n(make_app: AppFactory, n8n: FakeN8nServer) -> None:
    """Attack item 8: eight concurrent /readyz took 30 s each while n8n trickled (the
    readiness cache was filled only after the ping returned). One probe at a time asks
    n8n, in the background; every probe answers at once, the last known state marked
    stale while the ask is under way."""
    n8n.state.trickle_s = 1.5
    app = build(make_app, n8n.api_url)
    times: list[float] = []
    answers: list[dict[str, Any]] = []

    def probe() -> None:
        started = time.monotonic()
        r = app.test_client().get("/readyz")
        times.append(time.monotonic() - started)
        answers.append(r.get_json())

    threads = [threading.Thread(target=probe) for _ in range(8)]
    started_all = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(times) == 8 and max(times) < 1.5, times
    assert all(a["status"] == "ready" for a in answers)
    assert all(a["n8n"] == {"configured": True, "reachable": None, "stale": True} for a in answers)
    gets = [c for c in n8n.state.calls if c == ("GET", "/api/v1/executions")]
    assert len(gets) == 1, n8n.state.calls  # one ask, not eight
    # Once the ask has ended (its 2 s bound, plus the read in flight), probes answer
    # what it found: n8n timed out.
    deadline = time.monotonic() + 5
    while (r := app.test_client().get("/readyz").get_json())["n8n"].get("stale"):
        assert time.monotonic() < deadline, r
        time.sleep(0.1)
    assert r["n8n"]["reachable"] is False and r["n8n"]["warning"].startswith("timeout"), r
    assert time.monotonic() - started_all < 2 + 1.5 + 1


def test_a_chain_stop_whose_execution_n8n_still_reports_running_is_unconfirmed(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    """Queue mode (DESIGN §6): n8n accepts the stop but its worker died, so n8n keeps
    reporting the execution ``running``; after confirm_s the answer is ``unconfirmed``
    with ``status_after`` = n8n's last status, never ``stopped``."""
    n8n.state.add(FakeExecution("51", "wf-a", status="running", on_stop="ignore"))
    api = admin(build(make_app, n8n.api_url, confirm_s=0.5))
    chain = activation(api, "wf-a", "row:1", "51")["chain_id"]
    out = api.post(f"/v1/chains/{chain}/stop", {"reason": "loop"})[1]
    assert by_id(out)["51"] == {
        "execution_id": "51",
        "status_before": "running",
        "status_after": "running",
        "confirmed": False,
        "result": "unconfirmed",
        "error": None,
    }
    assert out["cancellation"]["state"] == "partial"
    assert n8n.state.stops() == ["51"]


def remembered_task(api: Api, workflow: str, *execution_ids: str) -> str:
    """A task of ``workflow`` whose requests carried ``execution_ids``, in order."""
    first, *rest = execution_ids
    status, task = api.post("/v1/tasks", {"workflow": workflow, "execution_id": first})
    assert status == 201, task
    tid = str(task["task"]["task_id"])
    for other in rest:
        status, out = api.post(f"/v1/tasks/{tid}/model-calls", {"execution_id": other})
        assert status == 200, out
    listed = api.get(f"/v1/tasks/{tid}")[1]["executions"]
    assert [e["execution_id"] for e in listed] == list(execution_ids)
    return tid


def test_a_task_stop_reaches_the_sub_executions_its_own_execution_started(
    store_url: str, clock: Clock, n8n: FakeN8nServer
) -> None:
    """A child workflow's execution (its own workflowId, n8n mode ``integrated``) that
    acted for the task is stopped when n8n's ``parentExecution`` names the task's own
    execution, a grandchild through its parent; the token holds only the task's
    workflow. n8n's data is read only for the executions of other workflows."""
    parent = FakeExecution("6", "wf-a", status="running")
    child = FakeExecution("7", "wf-child", mode="integrated", status="running", parent=parent)
    grandchild = FakeExecution("8", "wf-leaf", mode="integrated", parent=child)
    n8n.state.add(parent, child, grandchild)
    api = Api(scoped_app(store_url, clock, n8n).test_client(), SCOPED_TOKEN)
    tid = remembered_task(api, "wf-a", "6", "7", "8")
    status, out = api.post(f"/v1/tasks/{tid}/stop", {"reason": "loop"})
    assert status == 200, out
    got = by_id(out)
    assert {k: (v["result"], v["confirmed"]) for k, v in got.items()} == {
        "6": ("stopped", True),
        "7": ("stopped", True),
        "8": ("stopped", True),
    }
    assert got["7"]["status_before"] == "running" and got["8"]["status_before"] == "waiting"
    assert out["cancellation"]["state"] == "confirmed"
    assert n8n.state.stops() == ["6", "7", "8"]
    assert n8n.state.data_reads == ["7", "8"]  # each parent is read once, without data


def test_a_task_stop_refuses_another_workflows_execution_that_names_no_parent(
    store_url: str, clock: Clock, n8n: FakeN8nServer
) -> None:
    """B's top-level execution named on A's task: n8n says nothing started it, so it is
    refused, never stopped, whatever else the task's stop confirms."""
    n8n.state.add(FakeExecution("6", "wf-a"), FakeExecution("7", "wf-b", status="running"))
    api = Api(scoped_app(store_url, clock, n8n).test_client(), SCOPED_TOKEN)
    tid = remembered_task(api, "wf-a", "6", "7")
    out = api.post(f"/v1/tasks/{tid}/stop", {"reason": "loop"})[1]
    got = by_id(out)
    assert got["6"]["result"] == "stopped"
    assert got["7"]["result"] == "refused" and got["7"]["status_before"] is None
    assert "another workflow than 'wf-a'" in got["7"]["error"]
    assert "no execution started this execution" in got["7"]["error"]
    assert n8n.state.stops() == ["6"]
    assert n8n.state.executions["7"].status == "running"


def test_a_task_stop_refuses_a_sub_execution_of_another_workflows_run(
    store_url: str, clock: Clock, n8n: FakeN8nServer
) -> None:
    """B's executions started by B's own run, named on A's task: n8n's parents never
    reach an execution of A (B's child of B, and B's sub-workflow's child of B), so
    neither they nor B's run are stopped."""
    b_run = FakeExecution("9", "wf-b", status="running")
    b_child = FakeExecution("10", "wf-b", mode="integrated", status="running", parent=b_run)
    c_child = FakeExecution("11", "wf-c", mode="integrated", status="running", parent=b_run)
    n8n.state.add(FakeExecution("6", "wf-a"), b_run, b_child, c_child)
    api = Api(scoped_app(store_url, clock, n8n).test_client(), SCOPED_TOKEN)
    tid = remembered_task(api, "wf-a", "6", "10", "11")
    out = api.post(f"/v1/tasks/{tid}/stop", {"reason": "loop"})[1]
    got = by_id(out)
    assert {k: v["result"] for k, v in got.items()} == {
        "6": "stopped",
        "10": "refused",
        "11": "refused",
    }
    for eid in ("10", "11"):
        assert "no execution started its parent execution 9" in got[eid]["error"], got[eid]
    assert n8n.state.stops() == ["6"]
    assert {n8n.state.executions[k].status for k in ("9", "10", "11")} == {"running"}


def test_a_chain_stop_reaches_a_sub_execution_and_refuses_what_n8n_cannot_show(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    """A chain stop follows the same parents. A child whose data n8n withholds (past its
    display size) or whose answer is too large to read cannot be shown to be the chain's:
    it is refused, and the rest of the stop goes on (``partial``, not ``failed``)."""
    parent = FakeExecution("21", "wf-a")
    n8n.state.add(
        parent,
        FakeExecution("22", "wf-child", mode="integrated", parent=parent),
        FakeExecution("23", "wf-child", mode="integrated", parent=parent, too_large=True),
        FakeExecution("24", "wf-child", mode="integrated", parent=parent, data_pad=9 << 20),
    )
    api = admin(build(make_app, n8n.api_url))
    chain = activation(api, "wf-a", "row:1", "21")["chain_id"]
    for i, eid in enumerate(("22", "23", "24")):
        status, eff = api.post(
            "/v1/effects",
            {"chain_id": chain, "target_key": f"t{i}", "content": {"a": i}, "execution_id": eid},
        )
        assert status == 200, eff
    out = api.post(f"/v1/chains/{chain}/stop", {"reason": "loop"})[1]
    got = by_id(out)
    assert {k: v["result"] for k, v in got.items()} == {
        "21": "stopped",
        "22": "stopped",
        "23": "refused",
        "24": "refused",
    }
    assert "withheld the data of this execution" in got["23"]["error"]
    assert "withheld the data of this execution" in got["24"]["error"]
    assert out["cancellation"]["state"] == "partial" and out["cancellation"]["error"] is None
    assert n8n.state.stops() == ["21", "22"]
