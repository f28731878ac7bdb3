"""Rules the chains, ledger and task cores decide for the services: shared
stops, content selection, link takeover, who may loosen limits, who may
resume, which exit check completes. Pure functions, no app, no store."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core import operations as ops_core
from sidecar.core import tasks as tasks_core
from sidecar.core.chains import Link, content_of, takes_over
from sidecar.core.operations import BeginReason
from sidecar.core.stops import Stop, StopScope, covering, set_stop
from sidecar.core.tasks import EndReason, TaskLimits
from sidecar.errors import Forbidden, ValidationFailed

NOW = 1_800_000_000.0
STOP = Stop(NOW - 10, "runaway", "admin")


@pytest.mark.parametrize(
    ("workflow_stop", "chain_stop", "scope"),
    [
        (None, None, None),
        (STOP, None, StopScope.WORKFLOW),
        (None, STOP, StopScope.CHAIN),
        (STOP, STOP, StopScope.WORKFLOW),
    ],
)
def test_the_workflow_stop_covers_before_the_chain_stop(
    workflow_stop: Stop | None, chain_stop: Stop | None, scope: StopScope | None
) -> None:
    assert covering(workflow_stop, chain_stop) is scope


def test_each_domain_names_a_covering_stop_in_its_own_words() -> None:
    assert ops_core.stopped_by(None) is None
    assert ops_core.stopped_by(StopScope.WORKFLOW) is BeginReason.WORKFLOW_STOPPED
    assert ops_core.stopped_by(StopScope.CHAIN) is BeginReason.CHAIN_STOPPED
    assert tasks_core.stopped_by(None) is None
    assert tasks_core.stopped_by(StopScope.WORKFLOW) is EndReason.WORKFLOW_STOPPED
    assert tasks_core.stopped_by(StopScope.CHAIN) is EndReason.CHAIN_STOPPED


def test_stopping_again_keeps_the_first_stop() -> None:
    later = Stop(NOW, "again", "other")
    assert set_stop(None, later) == later
    assert set_stop(STOP, later) == STOP


@pytest.mark.parametrize(
    ("content", "event", "counted"),
    [
        ({"id": 1}, {"body": {"x": 1}}, {"id": 1}),
        (None, {"headers": {"h": 1}, "params": {}, "query": {}, "body": {"a": 1}}, {"a": 1}),
        (
            None,
            {"headers": {"h": 1}, "params": {"p": 2}, "query": {"q": 1}, "body": {}},
            {"query": {"q": 1}, "params": {"p": 2}},
        ),
        (None, {"current": {"row": 2}, "previous": {"row": 1}}, {"row": 2}),
        (None, {"subject": "hi"}, {"subject": "hi"}),
        (None, None, {}),
        (None, "text", "text"),
    ],
)
def test_content_is_what_a_redelivery_repeats(content: Any, event: Any, counted: Any) -> None:
    assert content_of(content, event) == counted


def test_a_live_link_outside_the_scope_is_never_taken_over() -> None:
    live = Link("other", "c1", 1, NOW + 60)
    dead = Link("other", "c1", 1, NOW)
    assert takes_over(None, False, NOW)
    assert takes_over(live, True, NOW)
    assert not takes_over(live, False, NOW)
    assert takes_over(dead, False, NOW)


def test_only_an_admin_may_loosen_limits() -> None:
    base = TaskLimits(max_tool_calls=10, per_tool={"search": 3})
    tighter = TaskLimits(max_tool_calls=5, per_tool={"search": 2})
    looser = TaskLimits(max_tool_calls=11, per_tool={"search": 4})
    tasks_core.require_tightened(base, tighter, admin=False)
    tasks_core.require_tightened(base, looser, admin=True)
    with pytest.raises(Forbidden, match=r"max_tool_calls, per_tool\.search"):
        tasks_core.require_tightened(base, looser, admin=False)


def _ended(stopped: bool) -> tasks_core.Task:
    task = tasks_core.new_task("t1", None, "wf", None, None, TaskLimits(), None, NOW, 0)
    if stopped:
        return tasks_core.stop(task, NOW)
    return tasks_core.end(task, EndReason.TOOL_BUDGET, NOW)


def test_a_stopped_task_is_resumed_by_an_admin_only() -> None:
    tasks_core.require_resumable(_ended(stopped=True), admin=True)
    tasks_core.require_resumable(_ended(stopped=False), admin=False)
    with pytest.raises(Forbidden, match="admin token only"):
        tasks_core.require_resumable(_ended(stopped=True), admin=False)


def test_a_policy_completes_only_through_its_exit_check() -> None:
    assert tasks_core.exit_check(None, None) is None
    assert tasks_core.exit_check(None, "named") == "named"
    assert tasks_core.exit_check("exit", None) == "exit"
    assert tasks_core.exit_check("exit", "exit") == "exit"
    with pytest.raises(ValidationFailed) as raised:
        tasks_core.exit_check("exit", "other")
    assert raised.value.errors[0]["loc"] == ["body", "check"]
