"""The ledger's state machine as pure functions: every row of DESIGN §1, no app, no store."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core import operations as core
from sidecar.core.operations import (
    BeginDecision,
    BeginReason,
    BeginRequest,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
)
from sidecar.errors import NotFound, StaleAttempt, StateConflict

NOW = 1_000_000.0
POLICY = OperationPolicy(max_attempts=3, retention_s=3600)


def req(fp: str = "fp-a", workflow: str | None = "wf", lease_s: float = 60) -> BeginRequest:
    return BeginRequest("op-1", {"s1": fp, "s0": "old-" + fp}, "s1", workflow, lease_s=lease_s)


def started(now: float = NOW) -> Operation:
    op, out = core.begin(None, req(), POLICY, now)
    assert op is not None and out.decision is BeginDecision.EXECUTE
    return op


def test_none_executes_attempt_one_with_lease() -> None:
    op, out = core.begin(None, req(lease_s=30), POLICY, NOW)
    assert out.decision is BeginDecision.EXECUTE and out.reason is BeginReason.NEW
    assert op is not None
    assert (op.state, op.attempt, op.lease_expires_at) == (OperationState.IN_PROGRESS, 1, NOW + 30)
    assert (op.fingerprint, op.secret_id, op.workflow) == ("fp-a", "s1", "wf")


@pytest.mark.parametrize("state", list(OperationState))
def test_different_payload_is_conflict_in_every_state(state: OperationState) -> None:
    op = replace(started(), state=state)
    new, out = core.begin(op, req(fp="fp-b"), POLICY, NOW + 1)
    assert new is None
    assert (out.decision, out.reason) == (BeginDecision.CONFLICT, BeginReason.PAYLOAD_MISMATCH)


def test_other_workflow_same_payload_is_conflict() -> None:
    new, out = core.begin(started(), req(workflow="wf-other"), POLICY, NOW + 1)
    assert new is None and out.reason is BeginReason.WORKFLOW_MISMATCH


def test_workflow_is_part_of_the_operation() -> None:
    """A begin naming no workflow never replays a record made for one (no planted receipts)."""
    op, _ = core.commit(started(), "op-1", 1, "r", None, NOW)
    new, out = core.begin(op, req(workflow=None), POLICY, NOW + 1)
    assert new is None and out.reason is BeginReason.WORKFLOW_MISMATCH


def test_live_lease_is_in_progress_and_changes_nothing() -> None:
    new, out = core.begin(started(), req(), POLICY, NOW + 59.9)
    assert new is None and out.decision is BeginDecision.IN_PROGRESS


def test_expired_lease_becomes_unknown_and_reconcile() -> None:
    new, out = core.begin(started(), req(), POLICY, NOW + 60)
    assert new is not None and new.state is OperationState.UNKNOWN
    assert (out.decision, out.reason) == (BeginDecision.RECONCILE, BeginReason.LEASE_EXPIRED)


def test_unknown_is_never_executed_again() -> None:
    op = replace(started(), state=OperationState.UNKNOWN)
    for later in (1, 3600, 10**7):
        new, out = core.begin(op, req(), POLICY, NOW + later)
        assert new is None and out.decision is BeginDecision.RECONCILE


def test_committed_replays_with_receipt_and_result() -> None:
    op, _ = core.commit(started(), "op-1", 1, {"id": "r-1"}, {"row": 7}, NOW + 1)
    assert op is not None
    new, out = core.begin(op, req(), POLICY, NOW + 2)
    assert new is None and out.decision is BeginDecision.REPLAY
    assert out.operation is not None
    assert (out.operation.receipt, out.operation.result) == ({"id": "r-1"}, {"row": 7})


def test_not_committed_executes_again_until_max_attempts_then_exhausted() -> None:
    op: Operation | None = started()
    attempts = []
    for _ in range(POLICY.max_attempts):
        assert op is not None
        attempts.append(op.attempt)
        op, _ = core.fail(op, "op-1", op.attempt, FailOutcome.NOT_COMMITTED, "rejected", NOW)
        assert op is not None
        new, out = core.begin(op, req(), POLICY, NOW + 1)
        if out.decision is BeginDecision.EXHAUSTED:
            assert new is None and out.reason is BeginReason.ATTEMPTS_USED
            break
        assert out.decision is BeginDecision.EXECUTE and out.reason is BeginReason.RETRY
        op = new
    assert attempts == [1, 2, 3]


@pytest.mark.parametrize("stop", [BeginReason.WORKFLOW_STOPPED, BeginReason.CHAIN_STOPPED])
@pytest.mark.parametrize("existing", [False, True])
def test_stopped_changes_nothing(stop: BeginReason, existing: bool) -> None:
    op = started() if existing else None
    new, out = core.begin(op, req(), POLICY, NOW + 1, stopped=stop)
    assert new is None and out.decision is BeginDecision.STOPPED and out.reason is stop


def test_previous_secret_fingerprint_still_matches() -> None:
    op = replace(started(), secret_id="s0", fingerprint="old-fp-a")
    _, out = core.begin(op, req(), POLICY, NOW + 1)
    assert out.decision is BeginDecision.IN_PROGRESS


def test_forgotten_secret_is_conflict_not_replay() -> None:
    op, _ = core.commit(started(), "op-1", 1, "r", None, NOW)
    assert op is not None
    op = replace(op, secret_id="gone")
    _, out = core.begin(op, req(), POLICY, NOW + 1)
    assert out.decision is BeginDecision.CONFLICT


# -- commit / fail / reconcile ------------------------------------------------


def test_commit_is_fenced_by_attempt() -> None:
    with pytest.raises(StaleAttempt):
        core.commit(started(), "op-1", 2, "r", None, NOW)


def test_commit_after_lease_expiry_by_current_attempt_is_accepted() -> None:
    op, _ = core.commit(started(), "op-1", 1, "r", None, NOW + 3600)
    assert op is not None and op.state is OperationState.COMMITTED


def test_commit_repeated_same_receipt_is_noop_other_receipt_conflict() -> None:
    op, _ = core.commit(started(), "op-1", 1, {"id": 1}, None, NOW)
    new, same = core.commit(op, "op-1", 1, {"id": 1.0}, None, NOW + 1)
    assert new is None and same == op
    with pytest.raises(StateConflict):
        core.commit(op, "op-1", 1, {"id": 2}, None, NOW + 1)


def test_commit_unknown_operation_is_not_found() -> None:
    with pytest.raises(NotFound):
        core.commit(None, "op-1", 1, "r", None, NOW)


def test_commit_after_not_committed_is_conflict() -> None:
    op, _ = core.fail(started(), "op-1", 1, FailOutcome.NOT_COMMITTED, None, NOW)
    with pytest.raises(StateConflict):
        core.commit(op, "op-1", 1, "r", None, NOW)


def test_fail_unknown_then_commit_by_same_attempt_settles() -> None:
    op, _ = core.fail(started(), "op-1", 1, FailOutcome.UNKNOWN, "timeout", NOW + 5)
    assert op is not None and op.state is OperationState.UNKNOWN
    assert op.last_failure == {
        "attempt": 1,
        "outcome": "unknown",
        "detail": "timeout",
        "at": NOW + 5,
    }
    done, _ = core.commit(op, "op-1", 1, "r", None, NOW + 6)
    assert done is not None and done.state is OperationState.COMMITTED


def test_fail_on_committed_is_conflict_and_repeat_is_noop() -> None:
    op, _ = core.commit(started(), "op-1", 1, "r", None, NOW)
    with pytest.raises(StateConflict):
        core.fail(op, "op-1", 1, FailOutcome.UNKNOWN, None, NOW)
    nc, _ = core.fail(started(), "op-1", 1, FailOutcome.NOT_COMMITTED, None, NOW)
    again, _ = core.fail(nc, "op-1", 1, FailOutcome.NOT_COMMITTED, None, NOW + 1)
    assert again is None
    with pytest.raises(StateConflict):
        core.fail(nc, "op-1", 1, FailOutcome.UNKNOWN, None, NOW + 1)


def test_reconcile_refused_under_live_lease() -> None:
    with pytest.raises(StateConflict):
        core.reconcile(started(), "op-1", ReconcileOutcome.COMMITTED, "r", {"x": 1}, "op", NOW)


def test_reconcile_expired_lease_committed_records_evidence_and_actor() -> None:
    op, _ = core.reconcile(
        started(), "op-1", ReconcileOutcome.COMMITTED, "r-9", {"found": True}, "operator", NOW + 61
    )
    assert op is not None and op.state is OperationState.COMMITTED and op.receipt == "r-9"
    assert op.reconciliation == {
        "outcome": "committed",
        "evidence": {"found": True},
        "actor": "operator",
        "at": NOW + 61,
    }
    _, out = core.begin(op, req(), POLICY, NOW + 62)
    assert out.decision is BeginDecision.REPLAY


def test_reconcile_not_committed_allows_next_attempt() -> None:
    unknown, _ = core.fail(started(), "op-1", 1, FailOutcome.UNKNOWN, None, NOW)
    op, _ = core.reconcile(
        unknown, "op-1", ReconcileOutcome.NOT_COMMITTED, None, {"searched": "crm"}, "n8n", NOW + 1
    )
    new, out = core.begin(op, req(), POLICY, NOW + 2)
    assert out.decision is BeginDecision.EXECUTE and new is not None and new.attempt == 2


def test_reconcile_settled_differently_is_conflict() -> None:
    op, _ = core.commit(started(), "op-1", 1, "r", None, NOW)
    with pytest.raises(StateConflict):
        core.reconcile(op, "op-1", ReconcileOutcome.NOT_COMMITTED, None, {"e": 1}, "a", NOW)
    again, same = core.reconcile(op, "op-1", ReconcileOutcome.COMMITTED, "r", {"e": 1}, "a", NOW)
    assert again is None and same.state is OperationState.COMMITTED


def test_observe_shows_expired_lease_as_unknown_and_retention_rule() -> None:
    op = started()
    assert core.observe(op, NOW + 59).state is OperationState.IN_PROGRESS
    assert core.observe(op, NOW + 60).state is OperationState.UNKNOWN
    assert core.retention_s(op, POLICY) is None
    committed, _ = core.commit(op, "op-1", 1, "r", None, NOW)
    assert committed is not None and core.retention_s(committed, POLICY) == 3600


def test_doc_round_trip() -> None:
    op, _ = core.fail(started(), "op-1", 1, FailOutcome.UNKNOWN, "t", NOW)
    assert op is not None
    assert Operation.from_doc(op.to_doc()) == op


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["begin", "commit", "fail_nc", "fail_unknown", "reconcile_c", "reconcile_nc"]
        ),
        st.integers(min_value=1, max_value=4),  # attempt used by commit/fail
        st.floats(min_value=0, max_value=200),  # time step
    ),
    max_size=30,
)


@given(ACTIONS)
def test_a_write_known_or_possibly_done_is_never_executed_again(actions: list) -> None:
    """Whatever the sequence: after a commit, or while the outcome is unknown,
    ``begin`` never answers ``execute``; attempts never exceed max_attempts."""
    op: Operation | None = None
    now = NOW
    for action, attempt, step in actions:
        now += step
        try:
            if action == "begin":
                before = op
                new, out = core.begin(op, req(), POLICY, now)
                if out.decision is BeginDecision.EXECUTE and before is not None:
                    assert before.state is OperationState.NOT_COMMITTED
                op = new or op
            elif op is None:
                continue
            elif action == "commit":
                op = core.commit(op, "op-1", attempt, "r", None, now)[0] or op
            elif action.startswith("fail"):
                outcome = FailOutcome.NOT_COMMITTED if action == "fail_nc" else FailOutcome.UNKNOWN
                op = core.fail(op, "op-1", attempt, outcome, None, now)[0] or op
            else:
                outcome = (
                    ReconcileOutcome.COMMITTED
                    if action == "reconcile_c"
                    else ReconcileOutcome.NOT_COMMITTED
                )
                op = core.reconcile(op, "op-1", outcome, "r", {"e": 1}, "t", now)[0] or op
        except (StaleAttempt, StateConflict):
            pass
        if op is not None:
            assert 1 <= op.attempt <= POLICY.max_attempts


# -- hardening rules -----------------------------------------------------------


def test_once_unknown_a_fail_cannot_settle_it() -> None:
    op, _ = core.fail(started(), "op-1", 1, FailOutcome.UNKNOWN, "timeout", NOW + 1)
    assert op is not None and op.state is OperationState.UNKNOWN
    with pytest.raises(StateConflict):
        core.fail(op, "op-1", 1, FailOutcome.NOT_COMMITTED, "rejected", NOW + 2)
    expired = started()
    with pytest.raises(StateConflict):  # an expired lease is unknown too
        core.fail(expired, "op-1", 1, FailOutcome.NOT_COMMITTED, None, NOW + 61)
    late, _ = core.fail(expired, "op-1", 1, FailOutcome.UNKNOWN, "late", NOW + 61)
    assert late is not None and late.state is OperationState.UNKNOWN
    assert late.last_failure is not None and late.last_failure["detail"] == "late"


def test_the_recorded_reconcile_check_wins() -> None:
    spec = {"check": "found", "input": {"id": 1}}
    op = replace(started(), reconcile_check=spec)
    assert core.reconcile_check_of(None, spec) == (spec, False)
    assert core.reconcile_check_of(op, None) == (spec, False)
    assert core.reconcile_check_of(op, {"check": "found", "input": {"id": 1.0}}) == (spec, False)
    assert core.reconcile_check_of(op, {"check": "found", "input": {"id": 2}}) == (spec, True)
    bare = started()
    assert core.reconcile_check_of(bare, spec) == (None, True)


def test_only_checks_asking_the_system_of_record_may_reconcile() -> None:
    shapes = {
        "h": ("http", ()),
        "s": ("json_schema", ()),
        "o": ("operations", ()),
        "all_h_s": ("all", ("s", "h")),
        "any_h_s": ("any", ("h", "s")),
        "any_h_h": ("any", ("h", "all_h_s")),
        "loop": ("all", ("loop",)),
    }
    asks = {n for n in shapes if core.asks_system_of_record(n, shapes)}
    assert asks == {"h", "all_h_s", "any_h_h"}
    assert not core.asks_system_of_record("missing", shapes)


def test_open_operations_are_bounded_only_for_begins_that_open_one() -> None:
    policy = OperationPolicy(max_open_per_workflow=2)
    core.check_open_room(None, "wf", 1, policy)
    from sidecar.errors import TooManyOpen

    with pytest.raises(TooManyOpen):
        core.check_open_room(None, "wf", 2, policy)
    retry = replace(started(), state=OperationState.NOT_COMMITTED)
    with pytest.raises(TooManyOpen):
        core.check_open_room(retry, "wf", 2, policy)
    for state in (OperationState.IN_PROGRESS, OperationState.UNKNOWN, OperationState.COMMITTED):
        core.check_open_room(replace(started(), state=state), "wf", 5, policy)


def test_a_check_finding_about_an_older_version_is_ignored() -> None:
    """A slow reconcile check that saw attempt 1 must not settle the record after
    another begin already proved attempt 1 absent and ran attempt 2 (whose write
    may have landed): that would execute a third attempt beside the second."""
    op = started()
    unknown, _ = core.fail(op, "op-1", 1, FailOutcome.UNKNOWN, "timeout", NOW + 1)
    assert unknown is not None
    absent = core.CheckFinding("probe", False, True, {}, attempt=1, updated_at=unknown.updated_at)
    second, out = core.begin_after_check(unknown, req(), absent, POLICY, NOW + 2)
    assert out.decision is BeginDecision.EXECUTE and second is not None and second.attempt == 2
    # attempt 2's lease expires: it is unknown too; the slow check of attempt 1 comes back
    late, out = core.begin_after_check(second, req(), absent, POLICY, NOW + 200)
    assert out.decision is BeginDecision.RECONCILE
    assert late is None or late.attempt == 2
    # a finding about the current version is applied
    fresh = replace(absent, attempt=2, updated_at=second.updated_at)
    _, out = core.begin_after_check(second, req(), fresh, POLICY, NOW + 201)
    assert out.decision is BeginDecision.EXECUTE and out.operation.attempt == 3
