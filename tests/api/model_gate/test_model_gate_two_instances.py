"""Two sidecar instances on one store (two gunicorn workers, or two hosts)
drive turns of the same task. Each admits a turn on the task as it last
wrote it, and the store's compare-and-set checks that guess: together they
never admit past the task's budget, and a task stopped through one is
refused by the other on its next turn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fake_llm import FakeLLM
from task_agent import Agent
from test_model_gate import gate_app, llm, text_of, turn, used

from conftest import ADMIN_TOKEN, Api, AppFactory

__all__ = ["llm"]
pytestmark = pytest.mark.all_stores


def _burst(apis: list[Api], task_id: str, n: int) -> list[tuple[int, Any]]:
    """``n`` turns of the task at once, alternating between the instances."""
    barrier = threading.Barrier(n)

    def one(i: int) -> tuple[int, Any]:
        api = Api(apis[i % len(apis)].client.application.test_client())
        barrier.wait()
        return turn(api, "chat", task_id)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize("mode", ["final", "tool_call"])
def test_two_instances_together_admit_exactly_the_task_s_model_calls(
    make_app: AppFactory, llm: FakeLLM, mode: str
) -> None:
    a = Api(gate_app(make_app, llm).test_client())
    b = Api(gate_app(make_app, llm).test_client())
    llm.mode = mode
    for _ in range(2):
        limits = {"max_model_calls": 9, "max_same_call": 1000, "max_tool_calls": 1000}
        agent = Agent(a, token=ADMIN_TOKEN, limits=limits)
        for api in (a, b, a):  # each instance has written the task once at least
            assert turn(api, "chat", agent.id)[0] == 200
        llm.requests.clear()
        results = _burst([a, b], agent.id, 16)
        assert all(status == 200 for status, _ in results), [r for r in results if r[0] != 200]
        assert len(llm.requests) == 9 - 3  # forwarded: the budget left, no more
        assert used(a, agent.id)["model_calls"] == 9  # every forwarded turn counted


@pytest.mark.parametrize("how", ["task", "workflow"])
def test_a_stop_through_one_instance_is_refused_by_the_other(
    make_app: AppFactory, llm: FakeLLM, how: str
) -> None:
    a = Api(gate_app(make_app, llm).test_client())
    admin_b = Api(gate_app(make_app, llm).test_client(), token=ADMIN_TOKEN)
    llm.mode = "final"
    status, out = Api(a.client, token=ADMIN_TOKEN).post("/v1/tasks", {"workflow": "wf-two"})
    assert status in (200, 201), out
    task_id = out["task"]["task_id"]
    for _ in range(2):  # the task is this instance's guess from now on
        assert turn(a, "chat", task_id)[0] == 200
    path = f"/v1/tasks/{task_id}/stop" if how == "task" else "/v1/workflows/wf-two/stop"
    assert admin_b.post(path, {"reason": "runaway"})[0] == 200
    before = len(llm.requests)
    status, out = turn(a, "chat", task_id)
    assert status == 200, out  # the gate's own answer, in the API's shape
    assert "FINAL answer" not in text_of("chat", out)
    assert len(llm.requests) == before  # never forwarded
