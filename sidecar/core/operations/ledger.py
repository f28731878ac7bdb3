"""The ledger's state machine (DESIGN §1): ``begin``, ``commit``, ``fail`` and
``reconcile``, fencing by attempt, lease expiry, the bound on open operations
and retention (the state diagram is in :mod:`sidecar.core.operations`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.canonical import canonical_json
from sidecar.core.frozen import evolve
from sidecar.core.operations.records import (
    OPEN_STATES,
    BeginDecision,
    BeginOutcome,
    BeginReason,
    BeginRequest,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
)
from sidecar.errors import NotFound, StaleAttempt, StateConflict, TooManyOpen


def check_open_room(
    op: Operation | None, workflow: str | None, open_count: int, policy: OperationPolicy
) -> None:
    """Refuse a begin that would open one more operation past the bound.

    Unknown records are never deleted (they may have landed), so their
    number is bounded instead: a begin that would make a new open record
    (a new id, or a retry after ``not_committed``) while ``open_count``
    already reached ``max_open_per_workflow`` is refused. Begins on open or
    committed records (replay, reconcile, wait) always pass.

    :raises TooManyOpen: the workflow holds ``max_open_per_workflow`` open operations.
    """
    opens = op is None or op.state is OperationState.NOT_COMMITTED
    if opens and open_count >= policy.max_open_per_workflow:
        who = f"workflow {workflow!r}" if workflow is not None else "the shared namespace"
        raise TooManyOpen(
            f"{who} holds {open_count} open operations (operations.max_open_per_workflow "
            f"is {policy.max_open_per_workflow}): commit, fail or reconcile some first"
        )


def observe(op: Operation, now: float) -> Operation:
    """The record as it stands at ``now``: an expired lease means ``unknown``.

    A worker whose lease ran out may have written or not: nobody knows.
    Reads show that at once, without waiting for the next ``begin`` to
    persist it.
    """
    if (
        op.state is OperationState.IN_PROGRESS
        and op.lease_expires_at is not None
        and now >= op.lease_expires_at
    ):
        return evolve(op, state=OperationState.UNKNOWN)
    return op


def retention_s(op: Operation, policy: OperationPolicy) -> float | None:
    """How long the store keeps ``op``: settled records for the retention,
    open ones (``in_progress``, ``unknown``) until a later change settles them."""
    return None if op.state in OPEN_STATES else policy.retention_s


def same_payload(op: Operation, fingerprints: Mapping[str, str]) -> bool:
    """True when the request's payload fingerprints like the record's, under
    the record's own secret. A record whose secret is no longer configured
    cannot be matched (and so is a conflict, never a replay)."""
    return fingerprints.get(op.secret_id) == op.fingerprint


def begin(
    op: Operation | None,
    req: BeginRequest,
    policy: OperationPolicy,
    now: float,
    stopped: BeginReason | None = None,
) -> tuple[Operation | None, BeginOutcome]:
    """Decide a ``begin`` (DESIGN §1 table, first matching row wins).

    :param stopped: ``WORKFLOW_STOPPED`` or ``CHAIN_STOPPED`` when a sticky
        stop covers the request (or the record's workflow or chain).
    :returns: the record to store (None: unchanged) and the outcome.
    """
    if stopped is not None:
        return None, BeginOutcome(BeginDecision.STOPPED, stopped, op)
    if op is None:
        new = Operation(
            operation_id=req.operation_id,
            state=OperationState.IN_PROGRESS,
            attempt=1,
            fingerprint=req.fingerprints[req.secret_id],
            secret_id=req.secret_id,
            workflow=req.workflow,
            task_id=req.task_id,
            chain_id=req.chain_id,
            created_at=now,
            updated_at=now,
            lease_expires_at=now + req.lease_s,
            reconcile_check=req.reconcile_check,
        )
        return new, BeginOutcome(BeginDecision.EXECUTE, BeginReason.NEW, new)
    if not same_payload(op, req.fingerprints):
        return None, BeginOutcome(BeginDecision.CONFLICT, BeginReason.PAYLOAD_MISMATCH, op)
    if req.workflow != op.workflow:
        # The workflow is part of what the id names: a begin that names no
        # workflow (or another) never replays a record made for a workflow,
        # so no token can plant a receipt for another workflow's flow.
        return None, BeginOutcome(BeginDecision.CONFLICT, BeginReason.WORKFLOW_MISMATCH, op)

    if op.state is OperationState.IN_PROGRESS:
        seen = observe(op, now)
        if seen.state is OperationState.IN_PROGRESS:
            return None, BeginOutcome(BeginDecision.IN_PROGRESS, BeginReason.LEASE_HELD, op)
        changed = evolve(seen, updated_at=now)
        return changed, BeginOutcome(BeginDecision.RECONCILE, BeginReason.LEASE_EXPIRED, changed)
    if op.state is OperationState.UNKNOWN:
        return None, BeginOutcome(BeginDecision.RECONCILE, BeginReason.OUTCOME_UNKNOWN, op)
    if op.state is OperationState.COMMITTED:
        return None, BeginOutcome(BeginDecision.REPLAY, BeginReason.COMMITTED, op)
    # not_committed: the write is known not to have happened.
    if op.attempt >= policy.max_attempts:
        return None, BeginOutcome(BeginDecision.EXHAUSTED, BeginReason.ATTEMPTS_USED, op)
    retry = evolve(
        op,
        state=OperationState.IN_PROGRESS,
        attempt=op.attempt + 1,
        updated_at=now,
        lease_expires_at=now + req.lease_s,
        task_id=req.task_id or op.task_id,
        chain_id=req.chain_id or op.chain_id,
    )
    return retry, BeginOutcome(BeginDecision.EXECUTE, BeginReason.RETRY, retry)


def _require(op: Operation | None, operation_id: str) -> Operation:
    if op is None:
        raise NotFound(f"no operation {operation_id!r}")
    return op


def _fence(op: Operation, attempt: int) -> None:
    if attempt != op.attempt:
        raise StaleAttempt(
            f"attempt {attempt} is not the current attempt ({op.attempt}) of "
            f"operation {op.operation_id!r}; nothing changed",
            operation=op,
        )


def _same_json(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


def commit(
    op: Operation | None,
    operation_id: str,
    attempt: int,
    receipt: Any,
    result: Any,
    now: float,
) -> tuple[Operation | None, Operation]:
    """Record that the current attempt's write happened, with its receipt.

    Allowed from ``in_progress`` (even past the lease: fencing is by attempt)
    and ``unknown`` (the flow learned the outcome late). Repeating a commit
    with the same receipt changes nothing.

    :raises NotFound: no such operation.
    :raises StaleAttempt: ``attempt`` is not the current attempt.
    :raises StateConflict: committed with another receipt, or not_committed.
    """
    op = _require(op, operation_id)
    _fence(op, attempt)
    if op.state is OperationState.COMMITTED:
        if _same_json(op.receipt, receipt):
            return None, op
        raise StateConflict(
            f"operation {operation_id!r} is already committed with another receipt",
            operation=op,
        )
    if op.state is OperationState.NOT_COMMITTED:
        raise StateConflict(
            f"attempt {attempt} of operation {operation_id!r} was reported not_committed",
            operation=op,
        )
    new = evolve(
        op,
        state=OperationState.COMMITTED,
        receipt=receipt,
        result=result,
        updated_at=now,
        lease_expires_at=None,
    )
    return new, new


def fail(
    op: Operation | None,
    operation_id: str,
    attempt: int,
    outcome: FailOutcome,
    detail: str | None,
    now: float,
) -> tuple[Operation | None, Operation]:
    """Record that the current attempt failed: ``not_committed`` when the
    receiver rejected the write, ``unknown`` when nobody can tell (a timeout
    never proves failure). Repeating the same outcome changes nothing.

    :raises NotFound: no such operation.
    :raises StaleAttempt: ``attempt`` is not the current attempt.
    :raises StateConflict: the operation is settled (committed, or not
        committed with the other outcome), or its outcome is unknown (stored
        or by an expired lease) and the fail claims ``not_committed``: once
        unknown, only reconciliation settles it.
    """
    op = _require(op, operation_id)
    _fence(op, attempt)
    target = OperationState(outcome.value)
    if op.state is target:
        return None, op
    seen = observe(op, now)
    if seen.state is OperationState.UNKNOWN:
        if target is OperationState.UNKNOWN:
            # The lease ran out first; the caller agrees nobody knows: record why.
            new = evolve(
                seen,
                updated_at=now,
                last_failure={
                    "attempt": attempt,
                    "outcome": str(outcome),
                    "detail": detail,
                    "at": now,
                },
            )
            return new, new
        raise StateConflict(
            f"the outcome of operation {operation_id!r} is unknown: only a reconcile "
            "with evidence from the receiver settles it, never a later fail",
            operation=seen,
        )
    if op.state not in OPEN_STATES:
        raise StateConflict(
            f"operation {operation_id!r} is {op.state}; a fail cannot change that",
            operation=op,
        )
    new = evolve(
        op,
        state=target,
        updated_at=now,
        lease_expires_at=now if target is OperationState.UNKNOWN else None,
        last_failure={"attempt": attempt, "outcome": str(outcome), "detail": detail, "at": now},
    )
    return new, new


def release(
    op: Operation | None, operation_id: str, attempt: int, detail: str, now: float
) -> tuple[Operation, Operation]:
    """Give back an attempt that nobody was handed: the model gate began a write,
    then did not relay the answer that proposed it (DESIGN §5.1), so no
    writer holds ``attempt`` and nothing can have been written under it. The
    operation is ``not_committed`` at the attempt before (0 for a first
    begin): the next begin executes without spending an attempt, as if the
    released one had never begun.

    :raises NotFound: no such operation.
    :raises StaleAttempt: ``attempt`` is not the current attempt.
    :raises StateConflict: the operation is not ``in_progress`` under a live
        lease (settled, or its lease ran out: then it is unknown).
    """
    op = _require(op, operation_id)
    _fence(op, attempt)
    if observe(op, now).state is not OperationState.IN_PROGRESS:
        raise StateConflict(
            f"operation {operation_id!r} is {observe(op, now).state}; only a write "
            "being written may be released",
            operation=op,
        )
    new = evolve(
        op,
        state=OperationState.NOT_COMMITTED,
        attempt=attempt - 1,
        updated_at=now,
        lease_expires_at=None,
        last_failure={"attempt": attempt, "outcome": "released", "detail": detail, "at": now},
    )
    return new, new


def reconcile(
    op: Operation | None,
    operation_id: str,
    outcome: ReconcileOutcome,
    receipt: Any,
    evidence: Any,
    actor: str,
    now: float,
) -> tuple[Operation | None, Operation]:
    """Settle an open operation whose outcome is unknown, from evidence
    gathered at the receiver (or by an operator). ``evidence`` and ``actor``
    (the token name) are recorded. Repeating the same settlement changes
    nothing.

    :raises NotFound: no such operation.
    :raises StateConflict: a worker still holds the lease (wait for its
        commit or for the lease to expire), or the operation is already
        settled otherwise.
    """
    op = _require(op, operation_id)
    seen = observe(op, now)
    target = OperationState(outcome.value)
    if seen.state is OperationState.IN_PROGRESS:
        raise StateConflict(
            f"operation {operation_id!r} is in progress under a live lease; "
            "wait for its commit or for the lease to expire",
            operation=seen,
        )
    if seen.state is not OperationState.UNKNOWN:
        if seen.state is target and (
            target is OperationState.NOT_COMMITTED or _same_json(seen.receipt, receipt)
        ):
            return None, seen
        raise StateConflict(f"operation {operation_id!r} is already {seen.state}", operation=seen)
    new = evolve(
        seen,
        state=target,
        receipt=receipt if target is OperationState.COMMITTED else None,
        updated_at=now,
        lease_expires_at=None,
        reconciliation={"outcome": str(outcome), "evidence": evidence, "actor": actor, "at": now},
    )
    return new, new
