"""The operation ledger service: keys, transactions and plans around
:mod:`sidecar.core.operations`."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.checks import Checks
from sidecar.core import operations as core
from sidecar.core.operations import (
    OPEN_STATES,
    BeginDecision,
    BeginOutcome,
    BeginReason,
    BeginRequest,
    CheckFinding,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
)
from sidecar.errors import NotFound, ValidationFailed
from sidecar.service import keys
from sidecar.store import IndexEntry, Plan, Snapshot, Store, Write


@dataclass(frozen=True)
class BeginInput:
    """The validated ``begin`` body; the payload only as its fingerprints
    (secret id -> hex, from :meth:`Fingerprinter.fingerprints`)."""

    fingerprints: dict[str, str]
    workflow: str | None
    task_id: str | None
    chain_id: str | None
    lease_s: float | None
    reconcile: dict[str, Any] | None = None


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[Operation]
    next_cursor: str | None


class OperationService:
    """Runs ledger decisions as store transactions.

    :param store: the store every worker shares.
    :param fingerprinter: payload fingerprints (current and previous secrets).
    :param policy: attempts and retention.
    :param default_lease_s: the lease when ``begin`` names none.
    :param clock: epoch seconds; read once per request, before the transaction.
    :param checks: the configured checks, for reconcile-by-check.
    """

    def __init__(
        self,
        store: Store,
        fingerprinter: Fingerprinter,
        policy: OperationPolicy,
        default_lease_s: float,
        clock: Callable[[], float],
        checks: Checks | None = None,
    ) -> None:
        self.checks = checks
        self.store = store
        self.fingerprinter = fingerprinter
        self.policy = policy
        self.default_lease_s = default_lease_s
        self.clock = clock

    # -- plans -------------------------------------------------------------

    def plan(self, ns: str, op: Operation | None, result: Any) -> Plan[Any]:
        """Store ``op`` (None: nothing to write) and keep the open index in step."""
        plan: Plan[Any] = Plan(result)
        if op is None:
            return plan
        plan.writes[keys.operation(ns, op.operation_id)] = Write(
            op.to_doc(), core.retention_s(op, self.policy)
        )
        indexes = [keys.open_operations(ns)]
        if op.workflow is not None:
            indexes.append(keys.open_operations(ns, op.workflow))
        score = op.lease_expires_at if op.state in OPEN_STATES else None
        plan.index += [IndexEntry(ix, op.operation_id, score) for ix in indexes]
        return plan

    @staticmethod
    def _stopped(
        snap: Snapshot, workflow: str | None, chain_id: str | None, ns: str
    ) -> BeginReason | None:
        if workflow is not None and snap.get(keys.workflow_stop(workflow)) is not None:
            return BeginReason.WORKFLOW_STOPPED
        if chain_id is not None and snap.get(keys.chain_stop(ns, chain_id)) is not None:
            return BeginReason.CHAIN_STOPPED
        return None

    # -- decisions ---------------------------------------------------------

    def begin(
        self, principal: Principal, ns: str, operation_id: str, body: BeginInput
    ) -> BeginOutcome:
        """Decide a ``begin`` atomically (DESIGN §1).

        :raises Forbidden: the token may not act for the request's workflow,
            or for the existing record's workflow.
        :raises StoreUnavailable: fail closed.
        """
        now = self.clock()
        req = BeginRequest(
            operation_id=operation_id,
            fingerprints=body.fingerprints,
            secret_id=self.fingerprinter.current.id,
            workflow=body.workflow,
            task_id=body.task_id,
            chain_id=body.chain_id,
            lease_s=body.lease_s or self.default_lease_s,
            reconcile_check=body.reconcile,
        )
        key = keys.operation(ns, operation_id)
        declared = [key]
        if body.workflow is not None:
            declared.append(keys.workflow_stop(body.workflow))
        if body.chain_id is not None:
            declared.append(keys.chain_stop(ns, body.chain_id))

        def decide(snap: Snapshot, finding: CheckFinding | None = None) -> Plan[BeginOutcome]:
            op = Operation.from_doc(snap.get(key))
            if op is not None:
                principal.require(op.workflow, of_record=True)
            principal.require(body.workflow)
            workflow = op.workflow if op and op.workflow else body.workflow
            chain_id = op.chain_id if op and op.chain_id else body.chain_id
            stopped = self._stopped(snap, workflow, chain_id, ns)
            if finding is None:
                new, outcome = core.begin(op, req, self.policy, now, stopped)
            else:
                new, outcome = core.begin_after_check(
                    op, req, finding, self.policy, self.clock(), stopped
                )
            return self.plan(ns, new, outcome)

        # Most begins are of a new id: the store may decide on "absent" and
        # let its compare-and-set check it (one round trip on Redis).
        outcome = self.store.transact(declared, decide, absent_likely=True)
        spec = body.reconcile or (outcome.operation.reconcile_check if outcome.operation else None)
        if outcome.decision is BeginDecision.RECONCILE and spec is not None:
            finding = self._ask_receiver(spec)
            if finding is not None:
                outcome = self.store.transact(declared, lambda snap: decide(snap, finding))
        return outcome

    def _ask_receiver(self, spec: dict[str, Any]) -> CheckFinding | None:
        """Run a reconcile check (outside any transaction); None when it cannot run here."""
        name = spec.get("check")
        if not isinstance(name, str) or self.checks is None or name not in self.checks:
            return None
        if self.checks.needs_store(name):
            return None
        data = spec.get("input")
        result = self.checks.run(name, data, self.checks.prefetch(name, data))
        return CheckFinding.of(name, result.passed, str(result.reason), result.evidence)

    def commit(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        attempt: int,
        receipt: Any,
        result: Any,
    ) -> Operation:
        """Record the write of ``attempt`` as committed with ``receipt``.

        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.commit`.
        """
        now = self.clock()
        key = keys.operation(ns, operation_id)

        def decide(snap: Snapshot) -> Plan[Operation]:
            op = self._scoped(principal, snap.get(key), operation_id)
            new, out = core.commit(op, operation_id, attempt, receipt, result, now)
            return self.plan(ns, new, out)

        return self.store.transact([key], decide)

    def fail(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        attempt: int,
        outcome: FailOutcome,
        detail: str | None,
    ) -> Operation:
        """Record that ``attempt`` failed, with what is known of the outcome.

        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.fail`.
        """
        now = self.clock()
        key = keys.operation(ns, operation_id)

        def decide(snap: Snapshot) -> Plan[Operation]:
            op = self._scoped(principal, snap.get(key), operation_id)
            new, out = core.fail(op, operation_id, attempt, outcome, detail, now)
            return self.plan(ns, new, out)

        return self.store.transact([key], decide)

    def reconcile(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        outcome: ReconcileOutcome,
        receipt: Any,
        evidence: Any,
    ) -> Operation:
        """Settle an operation whose outcome was unknown; records evidence and actor.

        :raises NotFound, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.reconcile`.
        """
        now = self.clock()
        key = keys.operation(ns, operation_id)

        def decide(snap: Snapshot) -> Plan[Operation]:
            op = self._scoped(principal, snap.get(key), operation_id)
            new, out = core.reconcile(
                op, operation_id, outcome, receipt, evidence, principal.name, now
            )
            return self.plan(ns, new, out)

        return self.store.transact([key], decide)

    # -- reads -------------------------------------------------------------

    def get(self, principal: Principal, ns: str, operation_id: str) -> Operation:
        """The record as it stands now (an expired lease shows as ``unknown``).

        :raises NotFound: no such operation.
        :raises Forbidden: the record belongs to a workflow outside the scope.
        """
        doc = self.store.get(keys.operation(ns, operation_id))
        op = self._scoped(principal, doc, operation_id)
        return core.observe(op, self.clock())

    def list_open(
        self,
        principal: Principal,
        ns: str,
        state: OperationState,
        workflow: str | None,
        cursor: str | None,
        limit: int,
    ) -> Page:
        """List ``unknown`` (the reconciliation queue) or ``in_progress`` operations.

        Ordered by when the lease ended (or will end), oldest first.

        :param cursor: the ``next_cursor`` of the previous page.
        :raises Forbidden: ``workflow`` is outside the token's scope.
        :raises ValidationFailed: a scoped token names no workflow while it
            has several, or the cursor is not one this server issued.
        """
        now = self.clock()
        if workflow is None and principal.workflows is not None:
            if len(principal.workflows) != 1:
                raise ValidationFailed(
                    [
                        {
                            "loc": ["query", "workflow"],
                            "msg": "required for a token scoped to several workflows",
                        }
                    ]
                )
            (workflow,) = principal.workflows
        if workflow is not None:
            principal.require(workflow)
        after = decode_cursor(cursor)
        index = keys.open_operations(ns, workflow)
        if state is OperationState.UNKNOWN:
            entries = self.store.index_page(index, max_score=now, after=after, limit=limit)
        else:
            entries = self.store.index_page(index, min_score=now, after=after, limit=limit)
        docs = self.store.get_many([keys.operation(ns, m) for m, _ in entries])
        items = []
        for member, _ in entries:
            op = Operation.from_doc(docs[keys.operation(ns, member)])
            if op is None:
                continue
            seen = core.observe(op, now)
            if seen.state is state and principal.allows(seen.workflow):
                items.append(seen)
        full = len(entries) == limit
        return Page(items, encode_cursor(entries[-1][1], entries[-1][0]) if full else None)

    @staticmethod
    def _scoped(principal: Principal, doc: dict[str, Any] | None, operation_id: str) -> Operation:
        op = Operation.from_doc(doc)
        if op is None:
            raise NotFound(f"no operation {operation_id!r}")
        principal.require(op.workflow, of_record=True)
        return op


def encode_cursor(score: float, member: str) -> str:
    """An opaque page cursor: base64url of ``[score, member]``."""
    raw = json.dumps([score, member], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[float, str] | None:
    """:raises ValidationFailed: when the cursor was not made by :func:`encode_cursor`."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        score, member = json.loads(raw)
        if not isinstance(member, str) or not isinstance(score, int | float):
            raise ValueError
        member.encode("utf-8")
        score = float(score)
        if not math.isfinite(score):
            raise ValueError
        return score, member
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeError):
        error = {"loc": ["query", "cursor"], "msg": "not a valid cursor"}
        raise ValidationFailed([error]) from None
