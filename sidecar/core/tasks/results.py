"""Recording a tool call's result (DESIGN §3), as ordered steps:

1. the call must be in the history and waiting for its result (else 404 / 409);
2. a tool's configured check that ran replaces the caller's evidence (its
   revision, or none: the result is validated without measuring progress);
3. a write's operation is settled in the ledger, whatever the task's fate
   (a write that landed while the task was being stopped is still committed);
4. an ended task records the result and decides nothing more;
5. evidence that contradicts the task -> ``blocked``, ``invalid_evidence``:
   a revision below the current one, ``done`` on a result that is not
   ``ok``, an ``effect`` other than ``none`` on a read (``none`` on a write
   is step 7);
6. a check that cannot run -> ``unverified_result`` (a read) or
   ``unknown_commit`` (a write);
7. the write's settlement ends the task: ``effect: unknown``, a lost
   response or an ``ok`` without receipt -> ``unknown_commit``; ``effect:
   none`` -> ``invalid_evidence``; ``done`` with ``effect: not_committed`` ->
   ``unknown_commit`` (as the reference runners decide); a retryable write not proven
   ``not_committed`` -> ``retry_after_commit``;
8. the result is recorded at or after the task's deadline -> ``partial``,
   ``deadline`` (reference runner 000 checks its clock again once the
   result is in): after the ledger settled the write (a committed receipt
   is kept) and after every reason above (an uncertain write still ends
   ``needs_reconciliation``); before every reason below, so a late result
   is not counted as progress and a late ``done`` does not complete the task;
9. a cursor check that found a cycle -> ``cycle``;
10. ``fatal`` -> ``fatal_result``; ``needs_human`` -> ``human_input``;
11. ``retryable`` or ``unknown`` (a read): one more failure in a row, and,
    like every result whose revision does not rise, one idle result (a
    revision above the current one is progress, as both reference runners
    count it); ``max_idle`` idle results -> ``no_progress``, else past
    ``max_retries`` -> ``retry_budget`` (when both are reached at one result,
    ``no_progress`` wins: it is the stop both reference runners make there,
    and they have no retry allowance of their own);
12. ``ok``: the run of failures ends; a poll counts unchanged results in a
    row; a revision above the current one is progress (idle count back to
    0); otherwise the result is idle when it carries a revision, repeats a
    result seen before or failed its check (a result with no evidence and
    new content is neither; a poll is never idle: it is waiting);
13. ``done: true`` -> ``completed``, ``verified_done`` (before the idle
    count, as the reference runners decide);
14. ``max_idle`` idle results -> ``no_progress``; ``max_unchanged_polls``
    unchanged poll results in a row -> ``poll_stalled``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.core.frozen import evolve
from sidecar.core.operations import CheckFinding, Operation
from sidecar.core.tasks.ledger_bridge import settle_write
from sidecar.core.tasks.lifecycle import deadline_passed, end, idle_step
from sidecar.core.tasks.outcomes import EndReason, ResultDecision, ResultOutcome
from sidecar.core.tasks.state import (
    CALL_HISTORY,
    PRINT_DIGITS,
    CallKind,
    CallStatus,
    Effect,
    Evidence,
    ResultStatus,
    Task,
    identity_revision,
)
from sidecar.errors import NotFound, StateConflict


@dataclass(frozen=True)
class CheckVerdict:
    """What a tool's configured check said of its result.

    :ivar cannot_run: the system of record could not answer (unreachable,
        timeout, bad response): nothing was learned.
    :ivar revision: the revision the check read (a cursor check: records seen).
    """

    passed: bool
    reason: str
    revision: int | None = None
    cannot_run: bool = False


@dataclass(frozen=True)
class ToolResult:
    """A result as reported; with ``check``, the sidecar's own verdict replaces
    the caller's evidence. ``result_fp`` is the result's RFC 8785 fingerprint.

    :ivar reconciled: a write whose output proved nothing, and what its
        reconcile check then found at the receiver (the model gate, DESIGN
        §5.1): the operation becomes ``unknown`` and is reconciled at once.
    :ivar why: why a write's result proved nothing (the operation's
        ``last_failure`` detail), when the caller knows better than its status.
    """

    status: ResultStatus
    result_fp: str
    result: Any = None
    receipt: Any = None
    evidence: Evidence | None = None
    check: CheckVerdict | None = None
    reconciled: CheckFinding | None = None
    why: str | None = None


def progress(task: Task, revision: int, result: Any) -> Task:
    """The task at a higher validated revision: idle count back to 0, and the
    identical-call counts of lower revisions dropped (they cannot match again)."""
    kept = {k: n for k, n in task.identical_calls.items() if identity_revision(k) >= revision}
    return evolve(
        task,
        validated_revision=revision,
        last_good=result,
        identical_calls=kept,
        used=evolve(task.used, idle=0),
    )


def record_result(
    task: Task, call_id: str, res: ToolResult, op: Operation | None, now: float
) -> tuple[Task, Operation | None, ResultOutcome]:
    """Record a call's result and decide what it means for the task (steps above).

    :param op: the ledger record of the call's write (None for reads).
    :returns: the task and operation to store (None: unchanged), and the outcome.
    :raises NotFound: no such call in the task.
    :raises StateConflict: the call already has a result.
    """
    # 1
    call = task.call(call_id)
    if call is None:
        raise NotFound(f"no call {call_id!r} in task {task.task_id!r}")
    if call.status is not CallStatus.PENDING:
        raise StateConflict(f"call {call_id!r} already has a result ({call.status})")
    task = evolve(
        task, calls=task.calls_with_status(call_id, CallStatus(res.status)), updated_at=now
    )
    kind = call.kind

    # 2
    check = res.check
    if check is not None and not check.cannot_run:
        ev_from_check = None if check.revision is None else Evidence(revision=check.revision)
        res = evolve(res, evidence=ev_from_check)
    ev = res.evidence
    check_failed = check is not None and (check.cannot_run or not check.passed)

    # 3
    new_op: Operation | None = None
    uncertain: tuple[str, ...] = ()
    write_ends: EndReason | None = None
    if kind is CallKind.WRITE and op is not None:
        settled = settle_write(
            op,
            res.status,
            res.receipt,
            res.result,
            ev,
            check.reason if check_failed and check else None,
            now,
            res.reconciled,
            res.why,
        )
        new_op, write_ends, uncertain = settled.operation, settled.ends, settled.uncertain

    # 4
    if task.envelope is not None:
        return task, new_op, ResultOutcome(ResultDecision.ENDED, task.envelope.reason, False)

    def ended(reason: EndReason) -> tuple[Task, Operation | None, ResultOutcome]:
        return (
            end(task, reason, now, uncertain),
            new_op,
            ResultOutcome(ResultDecision.ENDED, reason),
        )

    # 5
    if ev is not None:
        if ev.revision is not None and ev.revision < task.validated_revision:
            return ended(EndReason.INVALID_EVIDENCE)
        if ev.done and res.status is not ResultStatus.OK:
            return ended(EndReason.INVALID_EVIDENCE)
        if kind is not CallKind.WRITE and ev.effect not in (None, Effect.NONE):
            return ended(EndReason.INVALID_EVIDENCE)
    # 6
    if check is not None and check.cannot_run:
        return ended(
            EndReason.UNKNOWN_COMMIT if kind is CallKind.WRITE else EndReason.UNVERIFIED_RESULT
        )
    # 7
    if write_ends is not None:
        return ended(write_ends)
    # 8
    if deadline_passed(task, now):
        return ended(EndReason.DEADLINE)
    # 9
    if check is not None and not check.passed and check.reason == "cycle":
        return ended(EndReason.CYCLE)
    # 10
    if res.status is ResultStatus.FATAL:
        return ended(EndReason.FATAL_RESULT)
    if res.status is ResultStatus.NEEDS_HUMAN:
        return ended(EndReason.HUMAN_INPUT)
    limits = task.limits
    rose = ev is not None and ev.revision is not None and ev.revision > task.validated_revision
    # 11
    if res.status in (ResultStatus.RETRYABLE, ResultStatus.UNKNOWN):
        retries = task.used.retries + 1
        task = evolve(task, used=evolve(task.used, retries=retries))
        idle_exhausted = False
        if rose and not check_failed and ev is not None and ev.revision is not None:
            task = progress(task, ev.revision, task.last_good)  # a failure is not a good result
        else:
            task, idle_exhausted = idle_step(task)
        if idle_exhausted:
            return ended(EndReason.NO_PROGRESS)
        if retries > limits.max_retries:
            return ended(EndReason.RETRY_BUDGET)
        return task, new_op, ResultOutcome(ResultDecision.RECORDED, None)

    # 12
    if task.used.retries:
        task = evolve(task, used=evolve(task.used, retries=0))
    result_print = res.result_fp[:PRINT_DIGITS]
    idle_exhausted = stalled = False
    if kind is CallKind.POLL:
        unchanged = task.used.unchanged_polls + 1 if result_print == task.last_poll else 0
        task = evolve(
            task, last_poll=result_print, used=evolve(task.used, unchanged_polls=unchanged)
        )
        stalled = unchanged >= limits.max_unchanged_polls
        if rose and ev is not None and ev.revision is not None:
            task = progress(task, ev.revision, res.result)
    elif rose and not check_failed and ev is not None and ev.revision is not None:
        task = progress(task, ev.revision, res.result)
    elif (
        (ev is not None and ev.revision is not None)
        or result_print in task.results_seen
        or check_failed
    ):
        task, idle_exhausted = idle_step(task)
    if kind is not CallKind.POLL:
        task = evolve(task, results_seen=(*task.results_seen, result_print)[-CALL_HISTORY:])
    # 13
    if ev is not None and ev.done:
        return ended(EndReason.VERIFIED_DONE)
    # 14
    if idle_exhausted:
        return ended(EndReason.NO_PROGRESS)
    if stalled:
        return ended(EndReason.POLL_STALLED)
    return task, new_op, ResultOutcome(ResultDecision.RECORDED, None)
