"""Runaway tasks (DESIGN §6): the pure rule, then a scripted workflow through the app
on every store: 20 normal tasks, then one that spends 6x their mean tokens."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from flask import Flask

from conftest import ADMIN_TOKEN, Api, AppFactory, Clock
from sidecar.core import outliers
from sidecar.core.outliers import OutlierAction, OutlierPolicy, Totals

# -- the rule ------------------------------------------------------------------------


def test_nothing_is_judged_before_min_tasks_finished() -> None:
    totals = Totals(tasks=19, tokens=19_000, model_calls=38, tool_calls=0)
    assert outliers.judge(totals, {"tokens": 10**9}, OutlierPolicy(min_tasks=20)) == []


def test_past_factor_times_the_mean_is_an_outlier_at_it_is_not() -> None:
    totals = Totals(tasks=20, tokens=20_000, model_calls=40, tool_calls=20)
    policy = OutlierPolicy(factor=5, min_tasks=20)
    assert outliers.judge(totals, {"tokens": 5000, "model_calls": 10}, policy) == []
    out = outliers.judge(totals, {"tokens": 5001, "model_calls": 11, "tool_calls": 1}, policy)
    assert [(e.measure, e.value, e.mean, e.bound) for e in out] == [
        ("tokens", 5001, 1000.0, 5000.0),
        ("model_calls", 11, 2.0, 10.0),
    ]


def test_a_measure_no_task_used_has_no_scale() -> None:
    totals = Totals(tasks=20, tokens=20_000, model_calls=40, tool_calls=0)
    assert outliers.judge(totals, {"tool_calls": 50}, OutlierPolicy()) == []


def test_the_action_decides_what_a_flag_does() -> None:
    """``stop`` ends a flagged task, ``wrap_up`` asks its model to conclude,
    ``flag`` only marks it; nothing happens to a task flagged on no measure."""
    flagged = [outliers.Exceeded("tokens", 600, 100.0, 500.0)]
    for action, ends, wraps in (
        ("stop", True, False),
        ("wrap_up", False, True),
        ("flag", False, False),
    ):
        policy = OutlierPolicy(action=OutlierAction(action))
        assert outliers.ends_task(flagged, policy) is ends
        assert outliers.wraps_up(flagged, policy) is wraps
        assert not outliers.ends_task([], policy) and not outliers.wraps_up([], policy)


def test_contribution_and_running_too_long() -> None:
    assert outliers.contribution({"tokens": 7, "model_calls": 2, "polls": 1}) == {
        "tasks": 1,
        "tokens": 7,
        "model_calls": 2,
        "tool_calls": 0,
    }
    policy = OutlierPolicy(running_s=60)
    assert not outliers.running_too_long(100.0, 160.0, policy)
    assert outliers.running_too_long(100.0, 160.5, policy)
    assert OutlierAction("stop") is OutlierAction.STOP


# -- through the app, on every store ----------------------------------------------------


def app_with(make_app: AppFactory, action: str = "flag") -> Flask:
    return make_app(outliers={"factor": 5, "min_tasks": 20, "running_s": 600, "action": action})


def normal_task(api: Api, tokens: int = 1000) -> str:
    status, out = api.post("/v1/tasks", {"workflow": "wf-agent"})
    assert status == 201, out
    tid = out["task"]["task_id"]
    api.post(f"/v1/tasks/{tid}/model-calls", {})
    api.post(f"/v1/tasks/{tid}/model-calls", {"tokens_used": tokens})
    status, done = api.post(f"/v1/tasks/{tid}/complete", {"evidence": {"done": True}})
    assert status == 200 and done["decision"] == "completed", done
    return str(tid)


def runaway(api: Api, tokens: int) -> tuple[str, dict[str, Any]]:
    out = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]
    tid = out["task"]["task_id"]
    api.post(f"/v1/tasks/{tid}/model-calls", {})
    status, turn = api.post(f"/v1/tasks/{tid}/model-calls", {"tokens_used": tokens})
    assert status == 200, turn
    return str(tid), dict(turn)


def outlier_count(app: Flask) -> float:
    text = app.test_client().get("/metrics").get_data(as_text=True)
    total = 0.0
    for line in text.splitlines():
        if line.startswith("loopstop_task_outliers_total{") and 'measure="tokens"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("action", ["flag", "stop"])
def test_a_task_spending_six_times_the_mean_is_flagged(
    make_app: AppFactory, action: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_with(make_app, action)
    api = Api(app.test_client())
    for _ in range(19):
        normal_task(api)
    # Before 20 tasks finished nothing is judged, however much a task spends.
    early, turn = runaway(api, 6000)
    assert turn["decision"] == "admit"
    assert api.get(f"/v1/tasks/{early}")[1]["outlier"] is None
    api.post(f"/v1/tasks/{early}/complete", {"evidence": {"done": True}})  # the 20th
    # The mean is now (19 x 1000 + 6000) / 20 = 1250 tokens: 6x is 7500.
    before = outlier_count(app)
    caplog.set_level(logging.INFO, logger="loopstop.decisions")
    tid, turn = runaway(api, 7500)
    status, seen = api.get(f"/v1/tasks/{tid}")
    assert status == 200
    mark = seen["outlier"]
    assert mark is not None and mark["action"] == action
    assert mark["exceeded"] == [
        {"measure": "tokens", "value": 7500, "mean": 1250.0, "bound": 6250.0}
    ]
    assert outlier_count(app) == before + 1
    lines = [
        json.loads(r.getMessage()) for r in caplog.records if "tasks.outlier" in r.getMessage()
    ]
    assert [(x["decision"], x["task_id"]) for x in lines] == [("flagged", tid)]
    if action == "flag":
        assert turn["decision"] == "admit" and seen["envelope"] is None
        # Flagged once: later turns neither count nor log it again.
        api.post(f"/v1/tasks/{tid}/model-calls", {"tokens_used": 10})
        assert outlier_count(app) == before + 1
    else:
        assert turn["decision"] == "deny"
        assert (turn["envelope"]["status"], turn["envelope"]["reason"]) == ("stopped", "outlier")
        assert seen["task"]["status"] == "stopped"


def test_a_normal_task_is_not_flagged(make_app: AppFactory) -> None:
    api = Api(app_with(make_app, "stop").test_client())
    for _ in range(20):
        normal_task(api)
    tid, turn = runaway(api, 4000)  # 4x the mean
    assert turn["decision"] == "admit"
    assert api.get(f"/v1/tasks/{tid}")[1]["outlier"] is None


def test_wrap_up_asks_the_model_to_conclude(make_app: AppFactory) -> None:
    api = Api(app_with(make_app, "wrap_up").test_client())
    for _ in range(20):
        normal_task(api)
    tid, turn = runaway(api, 6000)
    assert turn["decision"] == "admit" and turn["wrap_up"] is True
    assert api.get(f"/v1/tasks/{tid}")[1]["outlier"]["action"] == "wrap_up"


def test_tokens_reported_after_the_turn_stop_an_outlier(make_app: AppFactory) -> None:
    """The model gate reports usage after the turn (record_tokens): the same rule applies."""
    app = app_with(make_app, "stop")
    api = Api(app.test_client())
    for _ in range(20):
        normal_task(api)
    out = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]
    tid = out["task"]["task_id"]
    rt = app.extensions["loopstop"]
    with app.test_request_context():
        from sidecar.auth import ANONYMOUS

        task = rt.tasks.record_tokens(ANONYMOUS, "p", tid, 6000, execution_id="77")
    assert task.envelope is not None and str(task.envelope.reason) == "outlier"
    assert rt.tasks.watched("p", tid)["executions"][0]["execution_id"] == "77"


def test_long_running_tasks_are_counted(make_app: AppFactory, clock: Clock) -> None:
    app = app_with(make_app)
    api = Api(app.test_client())
    old = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]["task"]["task_id"]
    clock.advance(601)
    api.post("/v1/tasks", {"workflow": "wf-agent"})
    ended = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]["task"]["task_id"]
    api.post(f"/v1/tasks/{ended}/stop", {"reason": "x"}, token=ADMIN_TOKEN)

    def gauge() -> float:
        text = app.test_client().get("/metrics").get_data(as_text=True)
        line = next(x for x in text.splitlines() if x.startswith("loopstop_tasks_running_long "))
        return float(line.split()[1])

    assert gauge() == 1
    clock.advance(600)
    assert gauge() == 2
    api.post(f"/v1/tasks/{old}/stop", {"reason": "x"}, token=ADMIN_TOKEN)
    assert gauge() == 1
