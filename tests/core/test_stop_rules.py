"""The pure rules of stops that reach n8n (sidecar.core.executions): no app, no I/O."""

from __future__ import annotations

import pytest

from sidecar.core import executions as ex
from sidecar.core.executions import CancellationState, Confirmation
from sidecar.core.executions import Reported as R


def refused(target: ex.Target, *reports: R, mode: ex.ExecutionMode = "production") -> str | None:
    """:func:`reach`'s refusal once n8n reported ``reports`` (it must ask nothing more)."""
    step = ex.reach(target, mode, {r.execution_id: r for r in reports})
    assert step.ask is None, step
    return step.refused


def test_remember_adds_moves_and_bounds() -> None:
    got = ex.remember((), "1", "production", 10.0)
    assert got == ({"execution_id": "1", "execution_mode": "production", "at": 10.0},)
    assert ex.remember(got, "1", "production", 11.0) is None  # already the latest: no write
    assert ex.remember(got, None, "production", 11.0) is None
    two = ex.remember(got, "2", "test", 12.0)
    assert two is not None
    back = ex.remember(two, "1", "production", 13.0)
    assert back is not None and [e["execution_id"] for e in back] == ["2", "1"]
    many: tuple[dict[str, object], ...] = ()
    for i in range(60):
        many = ex.remember(many, str(i), "production", float(i)) or many
    assert len(many) == ex.REMEMBERED and many[0]["execution_id"] == "10"


def test_modes_follow_n8n() -> None:
    assert ex.mode_of_n8n("manual") == "test"
    for mode in ("webhook", "trigger", "retry", "integrated", "cli", None):
        assert ex.mode_of_n8n(mode) == "production"
    remembered = [
        {"execution_id": "1", "execution_mode": "test"},
        {"execution_id": "2", "execution_mode": "production"},
    ]
    assert ex.of_mode(remembered, "test") == ["1"]
    assert ex.of_mode(remembered, "production") == ["2"]


def test_only_a_finished_status_confirms() -> None:
    assert ex.judge("1", "waiting", "canceled").result is Confirmation.STOPPED
    finished = ex.judge("1", "running", "success")
    assert finished.result is Confirmation.FINISHED and finished.confirmed
    for status in ("running", "waiting", "new", "unknown", None):
        out = ex.judge("1", "running", status)
        assert out.result is Confirmation.UNCONFIRMED and not out.confirmed
    already = ex.judge("1", "error", None)
    assert already.result is Confirmation.ALREADY_FINISHED and already.status_after == "error"
    missing = ex.judge("1", None, None, found=False)
    assert missing.result is Confirmation.NOT_FOUND and not missing.confirmed


def test_summaries() -> None:
    ok = ex.judge("1", "waiting", "canceled")
    open_ = ex.judge("2", "waiting", "waiting")
    assert ex.summarize([ok], None) is CancellationState.CONFIRMED
    assert ex.summarize([ok, open_], None) is CancellationState.PARTIAL
    assert ex.summarize([], None) is CancellationState.NOTHING_TO_STOP
    assert ex.summarize([ok], "unreachable: x") is CancellationState.FAILED


@pytest.mark.security
def test_item1_refusal_compares_n8ns_workflow_and_mode_with_the_records() -> None:
    """Attack item 1 (the rule): a remembered id is stopped only when n8n runs it for
    the workflow it was remembered for, in the stop's mode, and the token holds it."""
    remembered = (
        {"execution_id": "1", "execution_mode": "production", "workflow": "wf-a", "at": 1.0},
        {"execution_id": "2", "execution_mode": "production", "workflow": "wf-b", "at": 2.0},
        {"execution_id": "3", "execution_mode": "production", "at": 3.0},  # older entry
        {"execution_id": "4", "execution_mode": "test", "workflow": "wf-a", "at": 4.0},
    )
    got = ex.targets(remembered, "production", "wf-a", lambda w: w == "wf-a")
    assert [(t.execution_id, t.workflow, t.in_scope) for t in got] == [
        ("1", "wf-a", True),
        ("2", "wf-b", False),
        ("3", "wf-a", True),
    ]
    a, b, _ = got
    assert refused(a, R("1", "wf-a", "webhook")) is None
    assert "another workflow" in (refused(a, R("1", "wf-b", "webhook", parent_read=True)) or "")
    assert "another mode" in (refused(a, R("1", "wf-a", "manual")) or "")
    assert "scope" in (ex.refusal_before_asking(b) or "")
    assert "no workflow" in (ex.refusal_before_asking(ex.Target("5", None)) or "")
    assert "not an n8n execution id" in (ex.refusal_before_asking(ex.Target("5\n", "wf-a")) or "")
    assert ex.remember((), "9", "production", 1.0, workflow="wf-a") == (
        {"execution_id": "9", "execution_mode": "production", "workflow": "wf-a", "at": 1.0},
    )


def test_a_sub_execution_is_reached_through_the_parents_n8n_names() -> None:
    """A sub-workflow's execution (another workflowId, n8n mode ``integrated``) is the
    record's when n8n's ``parentExecution`` chain reaches an execution of the record's
    workflow in the stop's mode; n8n is asked only what the rule needs, step by step."""
    a = ex.Target("7", "wf-a")
    assert ex.reach(a, "production", {}) == ex.Lineage(ask="7")
    child = R("7", "wf-child", "integrated")
    assert ex.reach(a, "production", {"7": child}) == ex.Lineage(ask="7", with_parent=True)
    child = R("7", "wf-child", "integrated", parent_read=True, parent_id="6")
    assert ex.reach(a, "production", {"7": child}) == ex.Lineage(ask="6")
    assert refused(a, child, R("6", "wf-a", "webhook")) is None
    # A grandchild: two parents up (the middle one read with its data too).
    mid = R("6", "wf-mid", "integrated", parent_read=True, parent_id="5")
    assert refused(a, child, mid, R("5", "wf-a", "trigger")) is None
    # The parent of the record's workflow is of the other mode: refused.
    assert "another mode" in (refused(a, child, R("6", "wf-a", "manual")) or "")
    assert refused(a, child, R("6", "wf-a", "manual"), mode="test") is None


def test_another_workflows_execution_no_execution_of_the_records_started_is_refused() -> None:
    a = ex.Target("7", "wf-a")
    cases = {
        "no execution started": [R("7", "wf-b", "webhook", parent_read=True)],
        "withheld": [R("7", "wf-b", "integrated", parent_read=True, data_withheld=True)],
        "does not know": [
            R("7", "wf-b", "integrated", parent_read=True, parent_id="6"),
            R("6", None, None, found=False),
        ],
        "bad parent": [R("7", "wf-b", "integrated", parent_read=True, parent_id="6\n")],
    }
    # B's execution whose parent is B's own top-level run.
    cases["started its parent"] = [
        R("7", "wf-b", "integrated", parent_read=True, parent_id="6"),
        R("6", "wf-b", "webhook", parent_read=True),
    ]
    # A cycle n8n should never write, and a chain longer than the hops followed.
    cases["bad parent of its parent"] = [
        R("7", "wf-b", "integrated", parent_read=True, parent_id="6"),
        R("6", "wf-c", "integrated", parent_read=True, parent_id="7"),
    ]
    deep = [
        R(str(i), f"wf-{i}", "integrated", parent_read=True, parent_id=str(i - 1))
        for i in range(7, 7 - ex.MAX_PARENT_HOPS - 1, -1)
    ]
    cases[f"none within {ex.MAX_PARENT_HOPS} parents"] = [*deep, R("3", "wf-a", "webhook")]
    for why, reports in cases.items():
        got = refused(a, *reports) or ""
        assert got.startswith("refused: n8n runs this execution for another workflow"), got
        assert why in got, (why, got)
    # One hop fewer reaches it.
    assert refused(a, *deep[:-1], R("4", "wf-a", "webhook")) is None
    # A target refused before asking asks n8n nothing.
    assert ex.reach(ex.Target("7", "wf-a", in_scope=False), "production", {}).ask is None
