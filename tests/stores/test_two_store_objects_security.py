"""Two apps (two store objects, each with its own map of recent values) on one
store: decisions stay right when one's memory is stale."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from task_agent import Agent, admit_at_once

from conftest import ADMIN_TOKEN, Api, AppFactory, Clock

OP = "/v1/operations"
pytestmark = [pytest.mark.all_stores, pytest.mark.security]


def commit(api: Api, op_id: str, attempt: int, receipt: Any) -> tuple[int, Any]:
    return api.post(f"{OP}/{op_id}/commit", {"attempt": attempt, "receipt": receipt})


def fail(api: Api, op_id: str, attempt: int, outcome: str) -> tuple[int, Any]:
    return api.post(f"{OP}/{op_id}/fail", {"attempt": attempt, "outcome": outcome})


def _begins(apps: list[Any], op_id: str, n: int) -> list[str]:
    barrier = threading.Barrier(n)

    def one(i: int) -> str:
        client = Api(apps[i % len(apps)].test_client())
        barrier.wait()
        status, out = client.post(f"{OP}/{op_id}/begin", {"payload": {"x": 1}})
        assert status == 200, out
        return str(out["decision"])

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_concurrent_begins_across_two_workers_one_execute(make_app: AppFactory) -> None:
    a, b = make_app(operations={"max_attempts": 50}), make_app(operations={"max_attempts": 50})
    apis = [Api(a.test_client()), Api(b.test_client())]
    for round_ in range(6):
        decisions = _begins([a, b], "o", 32)
        assert decisions.count("execute") == 1, (round_, decisions)
        _status, got = apis[round_ % 2].get(f"{OP}/o")
        attempt = got["operation"]["attempt"]
        assert attempt == round_ + 1
        # the other worker fails it: the first one's memory is stale
        assert fail(apis[(round_ + 1) % 2], "o", attempt, "not_committed")[0] == 200
    decisions = _begins([a, b], "o", 32)
    assert decisions.count("execute") == 1


def test_fencing_with_stale_memory(make_app: AppFactory, clock: Clock) -> None:
    a, b = Api(make_app().test_client()), Api(make_app().test_client())
    assert a.begin("o", lease_s=10)["decision"] == "execute"
    clock.advance(11)
    assert b.begin("o")["decision"] == "reconcile"
    status, _ = b.post(
        f"{OP}/o/reconcile",
        {"outcome": "not_committed", "evidence": {"checked": "crm"}},
        token=ADMIN_TOKEN,
    )
    assert status == 200
    second = b.begin("o")
    assert second["decision"] == "execute" and second["operation"]["attempt"] == 2
    for late in (lambda: commit(a, "o", 1, "late"), lambda: fail(a, "o", 1, "unknown")):
        status, body = late()
        assert status == 409, body
    assert a.begin("o")["decision"] == "in_progress"
    assert commit(a, "o", 2, "r-2")[0] == 200
    status, body = commit(b, "o", 2, "r-other")
    assert status == 409
    assert b.begin("o")["operation"]["receipt"] == "r-2"


def test_budget_across_two_workers(make_app: AppFactory) -> None:
    a, b = make_app(), make_app()
    api_a = Api(a.test_client())
    agent = Agent(api_a, token=ADMIN_TOKEN, limits={"max_tool_calls": 7, "max_same_call": 100})
    # both warm their memory of the task
    assert agent.call("search", {"q": "a"})["decision"] == "execute"
    b_agent = Agent.__new__(Agent)  # the same task, driven through the other app
    b_agent.api, b_agent.token = Api(b.test_client()), ADMIN_TOKEN
    b_agent.id, b_agent.base = agent.id, agent.base
    assert b_agent.call("search", {"q": "b"})["decision"] == "execute"
    assert agent.call("search", {"q": "c"})["decision"] == "execute"
    decisions = admit_at_once((a, b), agent.base, 32)
    assert decisions.count("execute") == 4, decisions
    task = api_a.get(agent.base)[1]
    assert task["task"]["used"]["tool_calls"] == 7


def test_budget_with_totals_moving_under_two_workers(make_app: AppFactory) -> None:
    """Tool calls admitted on two workers while other tasks of the workflow end
    (their totals, read unchecked, move): the budget admits exactly its calls."""
    cfg = {"factor": 5, "min_tasks": 2, "running_s": 600, "action": "stop"}
    a, b = make_app(outliers=cfg), make_app(outliers=cfg)
    api_a, api_b = Api(a.test_client()), Api(b.test_client())
    agent = Agent(api_a, token=ADMIN_TOKEN, limits={"max_tool_calls": 9, "max_same_call": 100})
    assert agent.call("search", {"q": "a"})["decision"] == "execute"
    status, _ = api_b.post(
        f"{agent.base}/tool-calls",
        {"tool": "search", "kind": "read", "args": {"q": "b"}},
        token=ADMIN_TOKEN,
    )
    assert status == 200
    barrier = threading.Barrier(24)

    def work(i: int) -> str:
        client = Api((a, b)[i % 2].test_client())
        barrier.wait()
        if i % 3 == 0:
            status, out = client.post("/v1/tasks", {"workflow": "wf-sheets"}, token=ADMIN_TOKEN)
            tid = out["task"]["task_id"]
            client.post(f"/v1/tasks/{tid}/model-calls", {"tokens_used": 10}, token=ADMIN_TOKEN)
            status, out = client.post(
                f"/v1/tasks/{tid}/complete", {"evidence": {"done": True}}, token=ADMIN_TOKEN
            )
            assert status == 200, out
            return "other"
        status, out = client.post(
            f"{agent.base}/tool-calls",
            {"tool": "search", "kind": "read", "args": {"q": i}},
            token=ADMIN_TOKEN,
        )
        assert status == 200, out
        return str(out["decision"])

    for _ in range(2):
        barrier.reset()
        with ThreadPoolExecutor(24) as pool:
            list(pool.map(work, range(24)))
    task = api_a.get(agent.base, token=ADMIN_TOKEN)[1]
    assert task["task"]["used"]["tool_calls"] == 9


def _deep(n: int) -> Any:
    v: Any = "leaf"
    for _ in range(n):
        v = {"k": v}
    return v


@pytest.mark.parametrize(
    "receipt",
    [
        {"big": 2**64 + 1, "neg": -(2**63) - 1, "u64": 2**63 + 5},
        {"f": 1e-07, "g": 1e16, "h": -0.0, "i": 0.1, "j": 5e-324},
        {"s": '\u2028\u00e9\U0001f600\x7f\\/"', "e": ""},
        _deep(60),
        {"huge": "x" * 200_000, "list": list(range(5000))},
    ],
)
def test_receipts_read_back_equal_on_both_workers(make_app: AppFactory, receipt: Any) -> None:
    a, b = Api(make_app().test_client()), Api(make_app().test_client())
    assert a.begin("o")["decision"] == "execute"
    status, body = commit(a, "o", 1, receipt)
    assert status == 200, body
    assert commit(a, "o", 1, receipt)[0] == 200  # the same receipt again: a no-op
    for api in (b, a, b):
        out = api.begin("o")
        assert out["decision"] == "replay"
        assert out["operation"]["receipt"] == receipt
    assert commit(b, "o", 1, receipt)[0] == 200
