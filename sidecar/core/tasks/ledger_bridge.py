"""The task guard's one door to the operation ledger (:mod:`sidecar.core.operations`).

A write call reserves its business operation before it executes; its
result settles that operation. What the ledger answers is translated here
into what it means for the task, so the rest of the package never reads a
ledger state.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core import operations as ledger
from sidecar.core.operations import (
    BeginDecision,
    BeginRequest,
    CheckFinding,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
)
from sidecar.core.tasks.outcomes import DenyReason, EndReason
from sidecar.core.tasks.state import Effect, Evidence, ResultStatus
from sidecar.errors import StaleAttempt, StateConflict


@dataclass(frozen=True)
class WriteAdmission:
    """What the ledger says of a write about to be admitted.

    :ivar operation: the record to store if the call is admitted (None: unchanged).
    :ivar record: the record as it stands (a replay's receipt and result).
    :ivar ends: the task must end for this reason.
    :ivar denies: denied without ending the task (another worker is writing).
    :ivar replay: committed already: answer its receipt, execute nothing.
    :ivar store_anyway: ``operation`` is a fact to store even though the call
        is not admitted (an expired lease became ``unknown``).
    """

    operation: Operation | None
    record: Operation | None
    ends: EndReason | None = None
    denies: DenyReason | None = None
    replay: bool = False
    store_anyway: bool = False


def require_open_room(
    op: Operation | None, req: BeginRequest, policy: OperationPolicy, open_count: int
) -> None:
    """A write about to execute that opens one more operation of its workflow
    (a new id, or a retry after ``not_committed``) is refused once the workflow
    holds ``max_open_per_workflow`` open operations, as a ``begin`` is
    (:func:`sidecar.core.operations.check_open_room`).

    :param open_count: the workflow's open operations (in progress or unknown).
    :raises TooManyOpen: the bound is reached.
    """
    ledger.check_open_room(op, req.workflow, open_count, policy)


def admit_write(
    op: Operation | None, req: BeginRequest, policy: OperationPolicy, now: float
) -> WriteAdmission:
    """Ask the ledger to begin the write's operation (DESIGN §1 table)."""
    new, began = ledger.begin(op, req, policy, now)
    record = began.operation
    match began.decision:
        case BeginDecision.EXECUTE:
            return WriteAdmission(new, record)
        case BeginDecision.REPLAY:
            return WriteAdmission(None, record, replay=True)
        case BeginDecision.IN_PROGRESS:
            return WriteAdmission(None, record, denies=DenyReason.IN_PROGRESS)
        case BeginDecision.CONFLICT:
            return WriteAdmission(None, record, ends=EndReason.OPERATION_CONFLICT)
        case BeginDecision.EXHAUSTED:
            return WriteAdmission(None, record, ends=EndReason.RETRY_BUDGET)
        case BeginDecision.RECONCILE:
            return WriteAdmission(new, record, ends=EndReason.UNKNOWN_COMMIT, store_anyway=True)
        case _:  # STOPPED
            return WriteAdmission(None, record, ends=EndReason.WORKFLOW_STOPPED)


@dataclass(frozen=True)
class WriteSettlement:
    """A write's result applied to its operation.

    :ivar operation: the record to store (None: unchanged).
    :ivar ends: the task must end for this reason (the outcome is uncertain,
        or the evidence contradicts the write).
    :ivar uncertain: operation ids whose outcome is not known.
    """

    operation: Operation | None
    ends: EndReason | None
    uncertain: tuple[str, ...]


def settle_write(
    op: Operation,
    status: ResultStatus,
    receipt: object,
    result: object,
    evidence: Evidence | None,
    check_failed: str | None,
    now: float,
    reconciled: CheckFinding | None = None,
    why: str | None = None,
) -> WriteSettlement:
    """Bring the write's operation up to date from its result.

    In this order: a tool check that could not confirm the write, or
    evidence ``effect: unknown`` -> ``unknown``, ``unknown_commit``; evidence
    ``effect: none`` on a write -> ``unknown``, ``invalid_evidence``; ``done``
    with ``effect: not_committed`` -> ``unknown``, ``unknown_commit``; ``ok``
    with a receipt -> ``committed`` (without one -> ``unknown``,
    ``unknown_commit``); a lost response -> ``unknown``, ``unknown_commit``;
    ``effect: not_committed`` -> ``not_committed`` (a retry may execute);
    ``needs_human`` -> ``unknown`` (approval pending may mean queued);
    ``retryable`` -> ``unknown``, ``retry_after_commit``; ``fatal`` -> ``unknown``.

    :param check_failed: the reason of the tool's check when it did not pass.
    :param reconciled: the output proved nothing and the tool's reconcile check
        ran (:func:`settle_by_check`): it decides instead.
    :param why: why the result proved nothing, for the operation's
        ``last_failure`` detail (default: the status's own words).
    """
    oid, attempt = op.operation_id, op.attempt
    effect = evidence.effect if evidence is not None else None
    if reconciled is not None:
        return settle_by_check(op, reconciled, now, why)

    def fail(outcome: FailOutcome, detail: str, ends: EndReason | None) -> WriteSettlement:
        new, _ = ledger.fail(op, oid, attempt, outcome, detail, now)
        uncertain = (oid,) if outcome is FailOutcome.UNKNOWN else ()
        return WriteSettlement(new, ends, uncertain)

    try:
        if check_failed is not None:
            return fail(FailOutcome.UNKNOWN, f"check: {check_failed}", EndReason.UNKNOWN_COMMIT)
        if effect is Effect.UNKNOWN:
            return fail(FailOutcome.UNKNOWN, "effect unknown", EndReason.UNKNOWN_COMMIT)
        if effect is Effect.NONE:
            return fail(FailOutcome.UNKNOWN, "effect none on a write", EndReason.INVALID_EVIDENCE)
        if evidence is not None and evidence.done and effect is Effect.NOT_COMMITTED:
            # "done" by a write that did not happen: nobody knows what did.
            return fail(FailOutcome.UNKNOWN, "done but not committed", EndReason.UNKNOWN_COMMIT)
        if status is ResultStatus.OK and effect is not Effect.NOT_COMMITTED:
            if receipt is None:
                return fail(FailOutcome.UNKNOWN, "ok without a receipt", EndReason.UNKNOWN_COMMIT)
            new, _ = ledger.commit(op, oid, attempt, receipt, result, now)
            return WriteSettlement(new, None, ())
        if status is ResultStatus.UNKNOWN:
            return fail(FailOutcome.UNKNOWN, why or "result unknown", EndReason.UNKNOWN_COMMIT)
        if effect is Effect.NOT_COMMITTED:
            return fail(FailOutcome.NOT_COMMITTED, str(status), None)
        if status is ResultStatus.RETRYABLE:
            return fail(FailOutcome.UNKNOWN, str(status), EndReason.RETRY_AFTER_COMMIT)
        # needs_human: waiting for approval may mean queued; fatal: not proven absent.
        return fail(FailOutcome.UNKNOWN, str(status), None)
    except (StaleAttempt, StateConflict):  # superseded or settled: the ledger keeps what it knows
        seen = ledger.observe(op, now)
        return WriteSettlement(None, None, (oid,) if seen.state is OperationState.UNKNOWN else ())


def settle_by_check(
    op: Operation, finding: CheckFinding, now: float, why: str | None = None
) -> WriteSettlement:
    """A write whose output did not prove it (DESIGN §5.1): its operation
    becomes ``unknown``, then the reconcile check's finding settles it as
    ``POST /v1/operations/{id}/reconcile`` would, with the check's evidence and
    ``check:<name>`` as the actor: found -> ``committed`` (the task goes on;
    the receipt ``{"check": <name>, "found": true}``, which the model sees);
    proven absent -> ``not_committed`` (a later proposal may write again);
    undecided -> stays ``unknown``, the task ends ``unknown_commit``.
    """
    oid = op.operation_id
    try:
        unknown, _ = ledger.fail(
            op,
            oid,
            op.attempt,
            FailOutcome.UNKNOWN,
            why or "the output did not prove the write",
            now,
        )
    except (StaleAttempt, StateConflict):  # settled meanwhile: the ledger keeps what it knows
        seen = ledger.observe(op, now)
        return WriteSettlement(None, None, (oid,) if seen.state is OperationState.UNKNOWN else ())
    current = unknown or op
    actor = f"check:{finding.check}"
    if finding.found:
        # what the model is shown later: the check's name, never its URL (the
        # system of record's address stays in the reconcile's evidence)
        receipt = {"check": finding.check, "found": True}
        outcome = ReconcileOutcome.COMMITTED
    elif finding.absent:
        receipt, outcome = None, ReconcileOutcome.NOT_COMMITTED
    else:
        return WriteSettlement(current, EndReason.UNKNOWN_COMMIT, (oid,))
    settled, _ = ledger.reconcile(current, oid, outcome, receipt, finding.evidence, actor, now)
    return WriteSettlement(settled or current, None, ())


def unknown_operations(ops: dict[str, Operation | None], now: float) -> list[str]:
    """The ids of ``ops`` whose outcome is unknown at ``now`` (a resume waits for them)."""
    return sorted(
        oid
        for oid, op in ops.items()
        if op is not None and ledger.observe(op, now).state is OperationState.UNKNOWN
    )
