"""The pure rules of stops that reach n8n (sidecar.core.executions): no app, no I/O."""

from __future__ import annotations

from sidecar.core import executions as ex
from sidecar.core.executions import CancellationState, Confirmation


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
    assert ex.refusal(a, "production", "wf-a", "webhook") is None
    assert "another workflow" in (ex.refusal(a, "production", "wf-b", "webhook") or "")
    assert "another mode" in (ex.refusal(a, "production", "wf-a", "manual") or "")
    assert "scope" in (ex.refusal_before_asking(b) or "")
    assert "no workflow" in (ex.refusal_before_asking(ex.Target("5", None)) or "")
    assert "not an n8n execution id" in (ex.refusal_before_asking(ex.Target("5\n", "wf-a")) or "")
    assert ex.remember((), "9", "production", 1.0, workflow="wf-a") == (
        {"execution_id": "9", "execution_mode": "production", "workflow": "wf-a", "at": 1.0},
    )
