"""The operation ledger's state machine (DESIGN §1), as pure functions.

An *operation* is one business action ("confirm order 42 version 3"), named
by the caller's idempotency key (``operation_id``), never one attempt. The
ledger guarantees that a write which happened is never repeated: a retry of
a committed operation is answered with the recorded receipt (``replay``),
and a write whose outcome is unknown (a timeout, a lost response, a worker
that died holding the lease) is never re-executed automatically: it waits
for reconciliation. This follows the IETF draft "The Idempotency-Key HTTP
Header Field" (a key names the operation; a reuse with another payload is a
conflict) and fencing tokens (the ``attempt`` number: a late answer from a
superseded attempt changes nothing).

Every function takes the current record (or None), the request, the
policy and ``now`` (epoch seconds), and returns ``(new_record, outcome)``
where ``new_record`` is None when nothing changes. No I/O, no clock.

States::

    (none) --begin--> in_progress --commit--> committed
    in_progress --fail not_committed--> not_committed --begin--> in_progress (attempt + 1)
    in_progress --fail unknown, or lease expiry (seen by begin or a read)--> unknown
    unknown --reconcile committed--> committed
    unknown --reconcile not_committed--> not_committed

Once ``unknown``, an operation leaves only through reconciliation (evidence,
or a reconcile check that asked the system of record): a later ``fail`` is
a conflict, whatever it claims. The reconcile check recorded by the begin
that reserved the operation is the one used; only a check that asks the
system of record (:func:`asks_system_of_record`) may settle a write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

from sidecar.canonical import canonical_json
from sidecar.core.stops import StopScope
from sidecar.errors import NotFound, StaleAttempt, StateConflict, TooManyOpen


class OperationState(StrEnum):
    """Where an operation stands. ``in_progress`` and ``unknown`` are *open*."""

    IN_PROGRESS = "in_progress"
    UNKNOWN = "unknown"
    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"


OPEN_STATES = frozenset({OperationState.IN_PROGRESS, OperationState.UNKNOWN})


class BeginDecision(StrEnum):
    """What ``begin`` tells the flow to do; every value needs a branch in the flow."""

    EXECUTE = "execute"
    REPLAY = "replay"
    IN_PROGRESS = "in_progress"
    RECONCILE = "reconcile"
    CONFLICT = "conflict"
    EXHAUSTED = "exhausted"
    STOPPED = "stopped"


class BeginReason(StrEnum):
    """Why ``begin`` decided what it did (logged and returned as ``reason``)."""

    NEW = "new"
    RETRY = "retry_after_not_committed"
    LEASE_HELD = "lease_held"
    LEASE_EXPIRED = "lease_expired"
    OUTCOME_UNKNOWN = "outcome_unknown"
    COMMITTED = "committed"
    PAYLOAD_MISMATCH = "payload_mismatch"
    WORKFLOW_MISMATCH = "workflow_mismatch"
    ATTEMPTS_USED = "max_attempts"
    WORKFLOW_STOPPED = "workflow_stopped"
    CHAIN_STOPPED = "chain_stopped"
    RECONCILED_COMMITTED = "reconciled_committed"
    RECONCILED_NOT_COMMITTED = "reconciled_not_committed"


def stopped_by(scope: StopScope | None) -> BeginReason | None:
    """The reason a ``begin`` covered by a sticky stop is answered ``stopped``
    with (:func:`sidecar.core.stops.covering`); None when no stop covers it."""
    if scope is None:
        return None
    if scope is StopScope.WORKFLOW:
        return BeginReason.WORKFLOW_STOPPED
    return BeginReason.CHAIN_STOPPED


class FailOutcome(StrEnum):
    """What a failing caller knows: the write did not happen, or it cannot tell."""

    NOT_COMMITTED = "not_committed"
    UNKNOWN = "unknown"


class ReconcileOutcome(StrEnum):
    """What reconciliation established by asking the receiver."""

    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"


@dataclass(frozen=True)
class Operation:
    """The ledger record of one operation. Times are epoch seconds (UTC).

    :ivar fingerprint: HMAC of the payload's canonical JSON, under the
        secret ``secret_id`` (never the payload itself).
    :ivar attempt: the fencing token of the current attempt, from 1.
    :ivar lease_expires_at: while ``in_progress``, when the lease ends; for
        ``unknown``, when the outcome became unknown; else None.
    :ivar last_failure: ``{attempt, outcome, detail, at}`` of the latest ``fail``.
    :ivar reconciliation: ``{outcome, evidence, actor, at}`` once reconciled.
    :ivar reconcile_check: ``{check, input}``: how a later ``begin`` may ask the
        receiver when the outcome is unknown.
    """

    operation_id: str
    state: OperationState
    attempt: int
    fingerprint: str
    secret_id: str
    workflow: str | None
    task_id: str | None
    chain_id: str | None
    created_at: float
    updated_at: float
    lease_expires_at: float | None = None
    receipt: Any = None
    result: Any = None
    last_failure: dict[str, Any] | None = None
    reconciliation: dict[str, Any] | None = None
    reconcile_check: dict[str, Any] | None = None

    def to_doc(self) -> dict[str, Any]:
        """A JSON-ready dict (the stored document); fields are JSON values already,
        so a shallow copy does (``asdict`` would deep-copy every nested value)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["state"] = str(self.state)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Operation | None:
        """Rebuild a record from its stored document (None stays None)."""
        if doc is None:
            return None
        fields = dict(doc)
        fields["state"] = OperationState(fields["state"])
        return cls(**fields)


@dataclass(frozen=True)
class BeginRequest:
    """A ``begin`` as the core sees it.

    :ivar fingerprints: the payload's fingerprint under every known secret,
        keyed by secret id; ``secret_id`` names the current one, used for a
        new record.
    :ivar lease_s: how long the attempt holds the operation, seconds.
    """

    operation_id: str
    fingerprints: Mapping[str, str]
    secret_id: str
    workflow: str | None
    task_id: str | None = None
    chain_id: str | None = None
    lease_s: float = 60.0
    reconcile_check: dict[str, Any] | None = None


@dataclass(frozen=True)
class OperationPolicy:
    """Ledger limits: attempts before ``exhausted``; retention of settled records (s);
    how many open operations (in progress or unknown) one workflow may hold."""

    max_attempts: int = 3
    retention_s: float = 604_800
    max_open_per_workflow: int = 10_000


#: The lease a ``begin`` holds when neither it nor the configuration names one (s).
DEFAULT_LEASE_S = 60


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


def reconcile_check_of(
    op: Operation | None, requested: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, bool]:
    """The reconcile check to run for an unknown outcome, and whether the
    request's own was ignored.

    The check and input recorded by the begin that reserved the operation
    are the ones used: a later begin naming another (an input pointing at
    some other record could "prove" the write absent) is never used.

    :returns: ``(spec, ignored)``; ``ignored`` is True when the request named
        a reconcile check that differs from the recorded one.
    """
    if op is None:
        return requested, False
    recorded = op.reconcile_check
    ignored = requested is not None and (
        recorded is None or canonical_json(dict(requested)) != canonical_json(recorded)
    )
    return recorded, ignored


#: Check kinds that ask the system of record (an outside request).
ASKING_KINDS = frozenset({"http"})


def asks_system_of_record(
    name: str, checks: Mapping[str, tuple[str, Sequence[str]]], _depth: int = 0
) -> bool:
    """True when check ``name`` can only pass or prove absence by asking the
    system of record, so that it may settle a write whose outcome is unknown.

    ``http`` asks; ``all`` asks when one of its parts asks (every part must
    pass); ``any`` asks only when every part asks (any one part passing
    decides, so a part that asks nothing could settle the write alone). A
    schema, a cursor or an operations check asks nothing and never may.

    :param checks: name -> ``(kind, parts)`` of every configured check.
    """
    entry = checks.get(name)
    if entry is None or _depth > 32:
        return False
    kind, parts = entry
    if kind in ASKING_KINDS:
        return True
    if kind == "all":
        return any(asks_system_of_record(p, checks, _depth + 1) for p in parts)
    if kind == "any":
        return bool(parts) and all(asks_system_of_record(p, checks, _depth + 1) for p in parts)
    return False


@dataclass(frozen=True)
class BeginOutcome:
    """The answer to ``begin``: decision, reason and the record after the decision."""

    decision: BeginDecision
    reason: BeginReason
    operation: Operation | None


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
        return replace(op, state=OperationState.UNKNOWN)
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
        changed = replace(seen, updated_at=now)
        return changed, BeginOutcome(BeginDecision.RECONCILE, BeginReason.LEASE_EXPIRED, changed)
    if op.state is OperationState.UNKNOWN:
        return None, BeginOutcome(BeginDecision.RECONCILE, BeginReason.OUTCOME_UNKNOWN, op)
    if op.state is OperationState.COMMITTED:
        return None, BeginOutcome(BeginDecision.REPLAY, BeginReason.COMMITTED, op)
    # not_committed: the write is known not to have happened.
    if op.attempt >= policy.max_attempts:
        return None, BeginOutcome(BeginDecision.EXHAUSTED, BeginReason.ATTEMPTS_USED, op)
    retry = replace(
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
    new = replace(
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
            new = replace(
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
    new = replace(
        op,
        state=target,
        updated_at=now,
        lease_expires_at=now if target is OperationState.UNKNOWN else None,
        last_failure={"attempt": attempt, "outcome": str(outcome), "detail": detail, "at": now},
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
    new = replace(
        seen,
        state=target,
        receipt=receipt if target is OperationState.COMMITTED else None,
        updated_at=now,
        lease_expires_at=None,
        reconciliation={"outcome": str(outcome), "evidence": evidence, "actor": actor, "at": now},
    )
    return new, new


@dataclass(frozen=True)
class CheckFinding:
    """What a reconcile check found at the receiver.

    :ivar found: the record is there as the write would have left it.
    :ivar absent: the receiver proved it is not there (404 / 410).
    :ivar attempt: the attempt the check was asked about, with ``updated_at``
        the version of the record it saw: a finding about an older version
        (another begin settled it, or a newer attempt ran meanwhile) is stale.
    """

    check: str
    found: bool
    absent: bool
    evidence: dict[str, Any]
    attempt: int | None = None
    updated_at: float | None = None

    @classmethod
    def of(cls, check: str, passed: bool, reason: str, evidence: dict[str, Any]) -> CheckFinding:
        """Read a check's verdict: passed means found; the receiver answering
        404 or 410 for the record proves it absent; anything else decides nothing
        (an assertion that failed means the record exists in another state)."""
        absent = reason == "unexpected_status" and evidence.get("status") in (404, 410)
        return cls(check, passed, absent, evidence)


def begin_after_check(
    op: Operation | None,
    req: BeginRequest,
    finding: CheckFinding,
    policy: OperationPolicy,
    now: float,
    stopped: BeginReason | None = None,
) -> tuple[Operation | None, BeginOutcome]:
    """A ``begin`` that found the operation ``unknown`` and asked the receiver.

    Applied with a compare-and-set after the check ran outside the store
    transaction: if the record is no longer the version the check was asked
    about (``finding.attempt`` / ``finding.updated_at``), or no longer
    unknown, the check's finding is ignored and ``begin`` decides on what is
    stored. Found -> committed -> ``replay``; proven absent -> not committed -> ``execute`` (attempt
    + 1, within ``max_attempts``); undecided -> ``reconcile``.
    """
    if op is None or stopped is not None:
        return begin(op, req, policy, now, stopped)
    if (finding.attempt, finding.updated_at) != (op.attempt, op.updated_at):
        # The record changed while the check ran: what it found is about
        # another version (a later attempt may have written since). Decide on
        # what is stored; the next begin asks again.
        return begin(op, req, policy, now, stopped)
    seen = observe(op, now)
    if seen.state is not OperationState.UNKNOWN or not same_payload(op, req.fingerprints):
        return begin(op, req, policy, now, stopped)
    actor = f"check:{finding.check}"
    if finding.found:
        settled, _ = reconcile(
            op,
            op.operation_id,
            ReconcileOutcome.COMMITTED,
            {"check": finding.check, "evidence": finding.evidence},
            finding.evidence,
            actor,
            now,
        )
        assert settled is not None
        return settled, BeginOutcome(
            BeginDecision.REPLAY, BeginReason.RECONCILED_COMMITTED, settled
        )
    if finding.absent:
        settled, _ = reconcile(
            op, op.operation_id, ReconcileOutcome.NOT_COMMITTED, None, finding.evidence, actor, now
        )
        assert settled is not None
        new, out = begin(settled, req, policy, now)
        if out.decision is BeginDecision.EXECUTE:
            return new, replace(out, reason=BeginReason.RECONCILED_NOT_COMMITTED)
        return new or settled, out
    return begin(op, req, policy, now)
