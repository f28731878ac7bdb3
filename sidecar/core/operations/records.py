"""The operation ledger's records (DESIGN §1): states, decisions and reasons,
the operation record, a begin request, the ledger's policy and what a
covered begin answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.core.frozen import build, shallow_doc
from sidecar.core.stops import StopScope


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
        doc = shallow_doc(self)
        doc["state"] = str(self.state)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Operation | None:
        """Rebuild a record from its stored document (None stays None)."""
        if doc is None:
            return None
        fields = dict(doc)
        fields["state"] = OperationState(fields["state"])
        return build(cls, fields)


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


@dataclass(frozen=True)
class BeginOutcome:
    """The answer to ``begin``: decision, reason and the record after the decision."""

    decision: BeginDecision
    reason: BeginReason
    operation: Operation | None
