"""The operation ledger service: keys, transactions and plans around
:mod:`sidecar.core.operations`.

Namespaces (DESIGN §1): an operation id lives in its workflow's namespace
(``<ns>:op:<wf>/<id>``), so two workflows using one id make two operations
and no workflow can block or probe another's ids. ``scope: "shared"`` on a
begin (and a begin naming no workflow) uses the one shared namespace
(``<ns>:op:<id>``), which needs a token holding every workflow. A route
naming a workflow looks in that workflow's namespace first, then in the
shared one for a record of the same workflow (shared begins, and records
made before namespaces existed), so no committed write is forgotten.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from sidecar.errors import Forbidden, NotFound, ValidationFailed
from sidecar.service import keys
from sidecar.store import IndexEntry, Plan, Snapshot, Store, Write

log = logging.getLogger("loopstop")


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
    shared: bool = False


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
        self._counts: dict[str, tuple[int, float]] = {}
        self._counts_lock = threading.Lock()

    # -- plans -------------------------------------------------------------

    def plan(self, ns: str, op: Operation | None, result: Any, key: str | None = None) -> Plan[Any]:
        """Store ``op`` (None: nothing to write) at ``key`` and keep the open index in step.

        :param key: where the record was read (default: its workflow's namespace).
        """
        plan: Plan[Any] = Plan(result)
        if op is None:
            return plan
        key = key or keys.operation(ns, op.operation_id, op.workflow)
        plan.writes[key] = Write(op.to_doc(), core.retention_s(op, self.policy))
        indexes = [keys.open_operations(ns)]
        if op.workflow is not None:
            indexes.append(keys.open_operations(ns, op.workflow))
        score = op.lease_expires_at if op.state in OPEN_STATES else None
        member = key.removeprefix(f"{ns}:op:")
        plan.index += [IndexEntry(ix, member, score) for ix in indexes]
        return plan

    @staticmethod
    def find(
        snap: Snapshot, ns: str, operation_id: str, workflow: str | None
    ) -> tuple[str, Operation | None]:
        """Where the operation ``operation_id`` of ``workflow`` is (or would be) kept.

        ``workflow``'s namespace first, then the shared one when it holds a
        record of that same workflow; None looks in the shared one only.

        :returns: the key (to write back to) and the record, None when absent.
        """
        shared_key = keys.operation(ns, operation_id, None)
        if workflow is None:
            return shared_key, Operation.from_doc(snap.get(shared_key))
        own_key = keys.operation(ns, operation_id, workflow)
        own = Operation.from_doc(snap.get(own_key))
        if own is not None:
            return own_key, own
        shared = Operation.from_doc(snap.get(shared_key))
        if shared is not None and shared.workflow == workflow:
            return shared_key, shared
        return own_key, None

    def resolve_workflow(self, principal: Principal, workflow: str | None) -> str | None:
        """The workflow a route naming an operation acts for (DESIGN §1).

        Given: it must be in scope. Omitted: the token's only workflow, or
        the shared namespace for a token holding every workflow.

        :raises Forbidden: the workflow is outside the scope, or a token
            scoped to several workflows names none.
        """
        if workflow is None and principal.workflows is not None:
            if len(principal.workflows) == 1:
                (workflow,) = principal.workflows
            else:
                raise Forbidden(
                    f"token {principal.name!r} holds several workflows: name the operation's "
                    "workflow"
                )
        principal.require(workflow)
        return workflow

    def _open_count(self, ns: str, workflow: str | None) -> int:
        """Open operations of ``workflow`` (the shared namespace: all of them).

        Read fresh when near the bound; far below it, a count read less than
        a second ago (plus the begins this worker made since) is enough.
        """
        index = keys.open_operations(ns, workflow)
        with self._counts_lock:
            cached = self._counts.get(index)
        now = time.monotonic()
        if cached is not None:
            count, at = cached
            if now - at < 1.0 and count < self.policy.max_open_per_workflow // 2:
                return count
        count = self.store.index_count(index)
        with self._counts_lock:
            if len(self._counts) > 10_000:
                self._counts.clear()
            self._counts[index] = (count, now)
        return count

    def _opened(self, ns: str, workflow: str | None) -> None:
        index = keys.open_operations(ns, workflow)
        with self._counts_lock:
            cached = self._counts.get(index)
            if cached is not None:
                self._counts[index] = (cached[0] + 1, cached[1])

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
            or a shared begin comes from a token that does not hold every workflow.
        :raises TooManyOpen: the workflow holds ``max_open_per_workflow`` open operations.
        :raises StoreUnavailable: fail closed.
        """
        principal.require(body.workflow)
        if body.shared and principal.workflows is not None:
            raise Forbidden(
                f"token {principal.name!r} does not hold every workflow: it may not use the "
                'shared namespace (scope: "shared")'
            )
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
        space = None if body.shared else body.workflow
        declared = [keys.operation(ns, operation_id, space)]
        if space is not None:
            declared.append(keys.operation(ns, operation_id, None))
        if body.workflow is not None:
            declared.append(keys.workflow_stop(body.workflow))
        if body.chain_id is not None:
            declared.append(keys.chain_stop(ns, body.chain_id))
        open_count = self._open_count(ns, body.workflow)

        def decide(snap: Snapshot, finding: CheckFinding | None = None) -> Plan[BeginOutcome]:
            key, op = self.find(snap, ns, operation_id, space)
            workflow = op.workflow if op and op.workflow else body.workflow
            chain_id = op.chain_id if op and op.chain_id else body.chain_id
            stopped = self._stopped(snap, workflow, chain_id, ns)
            if stopped is None:
                core.check_open_room(op, body.workflow, open_count, self.policy)
            if finding is None:
                new, outcome = core.begin(op, req, self.policy, now, stopped)
            else:
                new, outcome = core.begin_after_check(
                    op, req, finding, self.policy, self.clock(), stopped
                )
            return self.plan(ns, new, outcome, key)

        # Most begins are of a new id: the store may decide on "absent" and
        # let its compare-and-set check it (one round trip on Redis).
        outcome = self.store.transact(declared, decide, absent_likely=True)
        if outcome.decision is BeginDecision.EXECUTE:
            self._opened(ns, body.workflow)
        recorded = outcome.operation if outcome.reason is not BeginReason.NEW else None
        spec, ignored = core.reconcile_check_of(recorded, body.reconcile)
        if ignored:
            log.warning(
                "operation %r: the begin's reconcile check differs from the one recorded by "
                "the begin that reserved it; the recorded one is used",
                operation_id,
            )
        if outcome.decision is BeginDecision.RECONCILE and spec is not None:
            asked_about = outcome.operation
            finding = self._ask_receiver(dict(spec), principal, body.workflow)
            if finding is not None and asked_about is not None:
                finding = replace(
                    finding, attempt=asked_about.attempt, updated_at=asked_about.updated_at
                )
                outcome = self.store.transact(declared, lambda snap: decide(snap, finding))
        return outcome

    def may_reconcile(self, name: str) -> bool:
        """True when check ``name`` asks the system of record (it may settle a write)."""
        if self.checks is None:
            return False
        return core.asks_system_of_record(name, self.checks.shapes())

    def _ask_receiver(
        self, spec: dict[str, Any], principal: Principal, workflow: str | None
    ) -> CheckFinding | None:
        """Run a reconcile check (outside any transaction); None when it cannot run here
        (unknown, reading the store, asking nothing of the system of record, or not
        open to ``workflow``)."""
        name = spec.get("check")
        if not isinstance(name, str) or self.checks is None or name not in self.checks:
            return None
        if self.checks.needs_store(name) or not self.may_reconcile(name):
            return None
        if not self.checks.open_to(name, principal.workflows, workflow):
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
        workflow: str | None = None,
    ) -> Operation:
        """Record the write of ``attempt`` as committed with ``receipt``.

        :param workflow: the workflow the begin gave (see :meth:`resolve_workflow`).
        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.commit`.
        """
        workflow = self.resolve_workflow(principal, workflow)
        now = self.clock()
        declared = self._declared(ns, operation_id, workflow)

        def decide(snap: Snapshot) -> Plan[Operation]:
            key, op = self._scoped(principal, snap, ns, operation_id, workflow)
            new, out = core.commit(op, operation_id, attempt, receipt, result, now)
            return self.plan(ns, new, out, key)

        # Likely what this process wrote at the begin: decided on that, checked.
        return self.store.transact(declared, decide, recent_likely=True)

    def fail(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        attempt: int,
        outcome: FailOutcome,
        detail: str | None,
        workflow: str | None = None,
    ) -> Operation:
        """Record that ``attempt`` failed, with what is known of the outcome.

        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.fail`.
        """
        workflow = self.resolve_workflow(principal, workflow)
        now = self.clock()
        declared = self._declared(ns, operation_id, workflow)

        def decide(snap: Snapshot) -> Plan[Operation]:
            key, op = self._scoped(principal, snap, ns, operation_id, workflow)
            new, out = core.fail(op, operation_id, attempt, outcome, detail, now)
            return self.plan(ns, new, out, key)

        return self.store.transact(declared, decide)

    def reconcile(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        outcome: ReconcileOutcome,
        receipt: Any,
        evidence: Any,
        workflow: str | None = None,
    ) -> Operation:
        """Settle an operation whose outcome was unknown; records evidence and actor.

        :raises NotFound, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.reconcile`.
        """
        workflow = self.resolve_workflow(principal, workflow)
        now = self.clock()
        declared = self._declared(ns, operation_id, workflow)

        def decide(snap: Snapshot) -> Plan[Operation]:
            key, op = self._scoped(principal, snap, ns, operation_id, workflow)
            new, out = core.reconcile(
                op, operation_id, outcome, receipt, evidence, principal.name, now
            )
            return self.plan(ns, new, out, key)

        return self.store.transact(declared, decide)

    # -- reads -------------------------------------------------------------

    def get(
        self, principal: Principal, ns: str, operation_id: str, workflow: str | None = None
    ) -> Operation:
        """The record as it stands now (an expired lease shows as ``unknown``).

        :raises NotFound: no such operation in the workflow's namespace (the
            same answer whether it exists elsewhere or nowhere).
        :raises Forbidden: the named workflow is outside the scope.
        """
        workflow = self.resolve_workflow(principal, workflow)
        declared = self._declared(ns, operation_id, workflow)
        docs = self.store.get_many(declared)
        snap = Snapshot(docs, lambda more: None)
        _, op = self._scoped(principal, snap, ns, operation_id, workflow)
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
        docs = self.store.get_many([keys.operation_at(ns, m) for m, _ in entries])
        items = []
        for member, _ in entries:
            op = Operation.from_doc(docs[keys.operation_at(ns, member)])
            if op is None:
                continue
            seen = core.observe(op, now)
            if seen.state is state and principal.allows(seen.workflow):
                items.append(seen)
        full = len(entries) == limit
        return Page(items, encode_cursor(entries[-1][1], entries[-1][0]) if full else None)

    @staticmethod
    def _declared(ns: str, operation_id: str, workflow: str | None) -> list[str]:
        shared = keys.operation(ns, operation_id, None)
        return (
            [shared] if workflow is None else [keys.operation(ns, operation_id, workflow), shared]
        )

    def _scoped(
        self, principal: Principal, snap: Snapshot, ns: str, operation_id: str, workflow: str | None
    ) -> tuple[str, Operation]:
        """:raises NotFound: absent from the workflow's namespace, or (shared) of
        a workflow outside the scope: one answer for both."""
        key, op = self.find(snap, ns, operation_id, workflow)
        if op is None or not principal.allows(op.workflow):
            where = f" in workflow {workflow!r}" if workflow is not None else ""
            raise NotFound(f"no operation {operation_id!r}{where}")
        return key, op


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
